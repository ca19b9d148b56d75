"""The vector index: one protocol (``base``), the implementations (``faiss_index``: flat, IVF,
float16/sq8 codes; ``reranked``: pq codes re-ranked on the full vectors; ``segments``: a base plus
an update's segments minus tombstones) and one factory (``factory``) that builds an index by kind
and storage and opens a stored one by the storage its meta records. FAISS is imported here only."""
