"""Questions -> vectors without torch or transformers: the read path's encoder.

The index's strategy is already resolved, so all a query needs is the model's ``tokenizer.json``
(the ``tokenizers`` library), the network exported to ONNX when the index was built
(``indexer.onnx_graph``) and the indexer's own NumPy ``Head`` (``indexer.head.encode``). Importing
torch and transformers and loading the model cost seconds per process; this costs a fraction.

Where the graph cannot be had (the export failed when the index was built), ``query_encoder``
falls back to the torch ``Embedder`` and ``describe`` says why.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from indexer.errors import BadInput
from indexer.head import Head, Tokenized, encode
from indexer.models import model_file, model_location, read_json
from indexer.onnx_graph import GraphSpec, OnnxGraph
from indexer.strategy import Strategy

if TYPE_CHECKING:
    from indexer.embedding import Embedder

_SPECIAL = ("cls_token", "sep_token", "bos_token", "eos_token")


def _token_text(value: object) -> str | None:
    """A special token as ``special_tokens_map.json`` or ``tokenizer_config.json`` writes it."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def graph_spec(strategy: Strategy) -> GraphSpec:
    """The exported graph that answers this (resolved) strategy's queries."""
    location = model_location(strategy.model)
    config = read_json(model_file(location, "config.json")) or {}
    num_layers = int(config.get("num_hidden_layers", 0))
    pooler = strategy.pooling == "pooler"
    layers = () if pooler else tuple(sorted({i % (num_layers + 1) for i in strategy.layers or (-1,)}))
    backend = "onnx-int8" if strategy.backend == "onnx-int8" else "onnx"
    return GraphSpec(location, layers, pooler, backend)


class QueryEncoder:
    """``embed(texts)`` as the ``Embedder`` does it for queries (truncated at ``max_length``), on
    ONNX Runtime and ``tokenizers``. ``strategy`` must be resolved (a stored one is). ``spin``:
    let idle threads spin between operators (indexing throughput; a server wants them asleep)."""

    encoder = "onnx"

    def __init__(
        self, strategy: Strategy, *, batch_size: int = 32, spec: GraphSpec | None = None, spin: bool = False
    ):
        from tokenizers import Tokenizer

        if not strategy.resolved:
            raise BadInput("the query encoder needs a resolved strategy (an index's stored one)")
        spec = spec or graph_spec(strategy)
        if not spec.exported:
            raise FileNotFoundError(spec.path)
        location = spec.location
        tokenizer_file = model_file(location, "tokenizer.json")
        if tokenizer_file is None:
            raise BadInput(f"model {strategy.model!r} has no tokenizer.json")
        self.tokenizer = Tokenizer.from_file(str(tokenizer_file))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=int(strategy.max_length or 512))
        config = read_json(model_file(location, "config.json")) or {}
        self.num_layers = int(config["num_hidden_layers"])
        self.hidden_size = int(config["hidden_size"])
        named = {
            **(read_json(model_file(location, "tokenizer_config.json")) or {}),
            **(read_json(model_file(location, "special_tokens_map.json")) or {}),
        }
        special = (
            self.tokenizer.token_to_id(t) for t in map(_token_text, (named.get(k) for k in _SPECIAL)) if t
        )
        self.special_ids = [i for i in special if i is not None]
        pad = _token_text(named.get("pad_token"))
        self.pad = (self.tokenizer.token_to_id(pad) if pad else None) or 0
        self.strategy = strategy
        self.head = Head(strategy, self.num_layers, self.special_ids)
        self.dimension = strategy.dimension(self.hidden_size)
        self.batch_size = batch_size
        self.network = OnnxGraph(
            spec.path, spec.layers, spec.pooler, spin=spin, per_text=spec.backend == "onnx-int8"
        )

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch(list(texts))]

    def tokenize_documents(self, texts: Sequence[str]) -> Tokenized:
        """As ``Embedder.tokenize(texts, chunk=True)``: with ``chunk_overlap``, a long text becomes
        its first window and then its overflowing ones, as the transformers tokenizer orders them."""
        overlap = self.strategy.chunk_overlap
        if overlap is None:
            return Tokenized(self.tokenize(texts), np.arange(len(texts), dtype=np.int64))
        windows = self.tokenizer.__class__.from_str(self.tokenizer.to_str())
        windows.enable_truncation(max_length=int(self.strategy.max_length or 512), stride=overlap)
        ids: list[list[int]] = []
        owners: list[int] = []
        for owner, encoding in enumerate(windows.encode_batch(list(texts))):
            pieces = [encoding, *encoding.overflowing]
            ids.extend(piece.ids for piece in pieces)
            owners.extend([owner] * len(pieces))
        return Tokenized(ids, np.asarray(owners, dtype=np.int64))

    def embed(self, texts: Sequence[str], *, progress: bool = False) -> np.ndarray:
        """One float32 vector per text, truncated at the strategy's max_length."""
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        return encode(
            self.network,
            self.tokenize(texts),
            [self.head],
            [self.dimension],
            batch_size=self.batch_size,
            pad=self.pad,
        )[0]

    def embed_documents(
        self, texts: Sequence[str], *, progress: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """Vectors for documents and the text index of each, as ``Embedder.embed_documents``: an
        index built on ONNX Runtime alone once its graph is exported (no torch imported)."""
        from tqdm import tqdm

        tokenized = self.tokenize_documents(texts)
        with tqdm(total=len(tokenized.ids), disable=not progress, unit="text", desc="embedding") as bar:
            vectors = encode(
                self.network,
                tokenized.ids,
                [self.head],
                [self.dimension],
                batch_size=self.batch_size,
                pad=self.pad,
                on_batch=bar.update,
            )[0]
        return vectors, tokenized.owners

    def export_for_queries(self) -> str | None:
        """Nothing to export: this encoder already runs the graph the index's queries run."""
        return None


def query_encoder(strategy: Strategy) -> QueryEncoder | Embedder:
    """The encoder for an index's queries: ``QueryEncoder`` when its graph was exported, else the
    torch ``Embedder`` (exporting first when it has never been tried, so a later process is fast),
    with ``encoder`` saying which and why."""
    spec = graph_spec(strategy)
    if spec.exported:
        return QueryEncoder(strategy, spec=spec)
    from indexer.embedding import Embedder

    embedder = Embedder(strategy)
    reason = spec.failed() or embedder.export_for_queries()
    if reason is None:
        return QueryEncoder(strategy, spec=spec)
    embedder.encoder = f"torch ({reason})"
    return embedder


def encoder_status(strategy: Strategy) -> str:
    """What ``info`` shows: ``onnx``, or ``torch (why)`` when queries cannot run without torch."""
    spec = graph_spec(strategy)
    if spec.exported:
        return "onnx"
    reason = spec.failed()
    return f"torch ({reason})" if reason else "onnx (graph not exported yet: the next query exports it)"
