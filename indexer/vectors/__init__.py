"""The vector index: one protocol (``base``), the implementations (``faiss_index``: flat, IVF,
float16/sq8 codes; ``reranked``: pq codes re-ranked on the full vectors; ``segments``: a base plus
an update's segments minus tombstones), one factory (``factory``) that makes every index (built by
kind and storage, opened by the storage its meta records, a segment, a range index) and the
per-entry view of a version's vectors (``entries``, the one place that maps vector ids to entries).
FAISS is imported here only; the rest of semsearch reaches it through these modules and the two
process-level calls below (FAISS itself is imported when they run, not with this package)."""

from indexer.vectors.faiss_index import single_threaded, unit_length

__all__ = ["single_threaded", "unit_length"]
