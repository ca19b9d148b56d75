"""An engine loading in a thread from before anything heavy is imported: ``semsearch serve``
starts it first thing, so NumPy, FAISS, ONNX Runtime, the index and the session load while the
main thread imports the web stack (measured in docs/profile-serve.md). This module imports none of
them itself."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from indexer.embedding.strategy import Strategy
    from indexer.encoders.options import EmbeddingOptions
    from indexer.encoders.rerankers import Reranker
    from search.read.encoding import Encoding
    from search.read.engine import SearchEngine
    from search.read.reranked import RerankOptions


def load_engine(
    index_dir: str | Path,
    options: EmbeddingOptions | None = None,
    rerank: str | Path | bool | Reranker | RerankOptions = True,
) -> Future[SearchEngine]:
    """``SearchEngine(index_dir, options=..., rerank=...)``, its imports included, in a thread of
    its own; the future holds the engine or the error opening the index raised."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="semsearch-load")
    loading = pool.submit(_open, index_dir, options, rerank)
    pool.shutdown(wait=False)  # the thread ends when the engine is loaded
    return loading


def _open(
    index_dir: str | Path,
    options: EmbeddingOptions | None,
    rerank: str | Path | bool | Reranker | RerankOptions,
) -> SearchEngine:
    from search.read.engine import SearchEngine

    engine = SearchEngine(index_dir, options=options, rerank=rerank)
    if engine.refused is None:  # a model that may not run here serves keyword searches alone
        engine.embedder.embed(["semsearch"])  # warm, and a model that yields NaN fails before serving
    return engine


def load_reranker(rerank: RerankOptions, options: EmbeddingOptions | None = None) -> Future[Reranker]:
    """The reranker ``rerank`` names, loaded as it says (``RerankOptions.load``), for a server
    with no index, loading in a thread of its own."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="semsearch-load")
    loading = pool.submit(_reranker, rerank, options)
    pool.shutdown(wait=False)
    return loading


def _reranker(rerank: RerankOptions, options: EmbeddingOptions | None) -> Reranker:
    from indexer.encoders.options import given

    return rerank.load(given(options).for_serving())


def load_encoding(strategy: Strategy, options: EmbeddingOptions | None = None) -> Future[Encoding]:
    """The encoder of ``strategy`` for a server with no index (``Encoding.load(serving=True)``),
    warmed up by one text (which also tells its dimension), loading in a thread of its own."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="semsearch-load")
    loading = pool.submit(_encoding, strategy, options)
    pool.shutdown(wait=False)
    return loading


def _encoding(strategy: Strategy, options: EmbeddingOptions | None) -> Encoding:
    from search.read.encoding import Encoding

    encoding = Encoding.load(strategy, serving=True, options=options)
    encoding.dimension  # noqa: B018 (embeds one text: the first request pays no warm-up)
    return encoding
