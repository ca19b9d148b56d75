"""semsearch's Python API in one place: ``import semsearch``.

This module only hands on names; the code lives in ``indexer`` (the writing side) and ``search``
(the reading side), which stay the packages to extend (docs/architecture.md). Names load on first
use, so importing semsearch costs nothing until a name is used.

Build and keep an index:
    Strategy        how a text becomes a vector (model, layers, pooling...), stored in the index
    build_index     a corpus file, an iterable of dicts or a pandas DataFrame -> an index directory
    add             upsert rows (a file, dicts, a DataFrame) into an index by id
    delete          remove entries by id
    compact         merge an index's update segments into one version
    FieldScoring    ``also=``: a second text per entry (question + answer) and its weight
    EmbeddingOptions ``options=``: where and how texts embed (device, precision, batch size, Ray)
    open_index      the stored index itself (its ``info()``, its catalog)

Vectors:
    encode          texts -> float32 vectors, with a strategy or exactly as an index's queries
                    (``as_="passage"``: as its entries, with the passage prefix)
    Encoding        a loaded encoder for many ``encode`` calls
    export_encoder  an index's query encoder as one standalone ONNX model + tokenizer

Tuning:
    read_labels     scored pairs, positive pairs, queries + judgements, or an FAQ -> labels
    tune            fine-tune the model on labels through a strategy -> a model directory

Search:
    SearchEngine    open an index once; ``search(query, k, where)`` -> list of ``Hit``;
                    ``SearchEngine(idx, rerank=FOLDER)`` reranks every search with a cross-encoder
    SearchRequest   one search as an object (``engine.answer(request)``): k, filter, mode, rerank...
    RerankOptions   ``rerank=``: a search's reranker, depth and fused weight, as one object
    rank_similar    rank a handful of sentences against one, without an index
    rerank          rank texts against a question with a reranker (a cross-encoder folder)
    reranker_for    a reranker loaded once, for many ``rerank`` calls (``model=``)
    find_duplicates pairs and groups of near-identical entries of an index
    calibrate       fit and store the rule that marks hits answered or not
    word_vectors    contextual vectors of each word of a text

Errors (each carries ``exit_code`` and ``http_status``): SemsearchError and its kinds BadInput,
FilterError, StrategyConflict, IndexLocked, IndexMoved, IndexDamaged, DiskFull, ModelFailed,
WorkerFailed.
"""

from __future__ import annotations

from indexer.lazy import lazy_exports

_SOURCES = {
    "Strategy": "indexer.embedding.strategy:Strategy",
    "build_index": "indexer.writing.build:build_index",
    "BuildReport": "indexer.writing.build:BuildReport",
    "add": "indexer.writing.update:add_to_index",
    "delete": "indexer.writing.update:delete_from_index",
    "compact": "indexer.writing.update:compact_index",
    "UpdateReport": "indexer.writing.update:UpdateReport",
    "FieldScoring": "indexer.embedding.fields:FieldScoring",
    "EmbeddingOptions": "indexer.encoders.options:EmbeddingOptions",
    "open_index": "indexer.store:open_index",
    "word_vectors": "indexer.encoders.words:word_vectors",
    "SearchEngine": "search.read.engine:SearchEngine",
    "Hit": "search.read.engine:Hit",
    "SearchRequest": "search.read.requests:SearchRequest",
    "RerankOptions": "search.read.reranked:RerankOptions",
    "rank_similar": "search.read.similar:rank_similar",
    "rerank": "search.read.reranking:rerank",
    "reranker_for": "indexer.encoders.rerankers:reranker_for",
    "find_duplicates": "search.read.duplicates:find_duplicates",
    "calibrate": "search.studies.calibrate:calibrate_index",
    "encode": "search.read.encoding:encode",
    "Encoding": "search.read.encoding:Encoding",
    "export_encoder": "indexer.writing.export:export_encoder",
    "read_labels": "search.studies.tuning:read_labels",
    "tune": "search.studies.tuning:tune",
    "SemsearchError": "indexer.errors:SemsearchError",
    "BadInput": "indexer.errors:BadInput",
    "FilterError": "indexer.errors:FilterError",
    "StrategyConflict": "indexer.errors:StrategyConflict",
    "IndexLocked": "indexer.errors:IndexLocked",
    "IndexMoved": "indexer.errors:IndexMoved",
    "IndexDamaged": "indexer.errors:IndexDamaged",
    "DiskFull": "indexer.errors:DiskFull",
    "ModelFailed": "indexer.errors:ModelFailed",
    "WorkerFailed": "indexer.errors:WorkerFailed",
}
"""Each public name -> ``module:attribute`` it is handed on from."""

__all__ = list(_SOURCES)
__getattr__, __dir__ = lazy_exports(__name__, _SOURCES)
