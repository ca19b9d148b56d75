"""The rerank stage of a search: a cross-encoder re-orders the first stage's best ``depth``
candidates of every question of a batch, and a hit's score is the reranker's fused with the
first stage's at the stage's weight: 1 is the reranker alone, 0 the first stage's order, between
them the weight fitted on held-back questions (``semsearch tune`` in the folder, ``calibrate
--rerank`` in the index), so that a reranker which did not beat its first stage there cannot rank
below it.

What a caller asks of the stage travels whole as ``RerankOptions``, as ``EmbeddingOptions`` does
for the encoder: the CLI builds it from one decorator (``search.cli.reranking``), a search's body
and Python's keywords with ``RerankOptions.asked``, a ``SearchRequest`` carries it, and it is
checked once (``RerankOptions.checked``). Each option that tunes a named reranker says once, beside
its field, how every caller asks it (``Tuning``): its flag and its body field are built from that.
Loaded (``RerankOptions.stage``), it is a ``Reranking`` (``load_reranker``: the one place
``search`` loads a reranker), its depth by ``rerank_depth`` (the one default rule).

NumPy is imported where pairs are scored: the CLI builds its flags from ``TUNING`` as it starts."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from indexer.embedding.strategy import BACKENDS
from indexer.errors import BadInput
from search.read.hybrid import MAX_RERANK_DEPTH, RERANK_DEPTH, Ranking

if TYPE_CHECKING:
    import numpy as np

    from indexer.encoders.options import EmbeddingOptions
    from indexer.encoders.rerankers import Reranker


RERANKER_KEY = "reranker"
"""The meta key of an index's default reranker (``semsearch index --rerank``, ``calibrate
--rerank``): {"path", "fingerprint"} and, where ``calibrate`` fitted one on labelled questions,
the ``weight`` a search fuses its score at."""


def index_weight(meta: Mapping[str, object], fingerprint: str) -> float | None:
    """The fused weight the index ``meta`` stores for the reranker of ``fingerprint`` (None: none,
    the folder's applies)."""
    stored = meta.get(RERANKER_KEY)
    if not isinstance(stored, dict) or stored.get("fingerprint") != fingerprint:
        return None
    weight = stored.get("weight")
    return float(weight) if isinstance(weight, int | float) and not isinstance(weight, bool) else None


def rerank_depth(k: int, asked: int | None = None) -> int:
    """The first stage's entries a reranker re-orders: ``asked``, else ``RERANK_DEPTH`` (at least k)."""
    return max(k, RERANK_DEPTH) if asked is None else asked


def load_reranker(
    model: str | Path, options: EmbeddingOptions | None = None, runtime: str | None = None
) -> Reranker:
    """The reranker of the folder ``model`` (``indexer.encoders.rerankers.reranker_for``): every
    reranker a search, a study or the server runs is loaded here."""
    from indexer.encoders.rerankers import reranker_for

    return reranker_for(model, options, runtime=runtime)


@dataclass(frozen=True)
class Tuning:
    """How every caller asks one option of a named reranker, said once beside its
    ``RerankOptions`` field (``tuning``): its ``--rerank-NAME`` flag (``search.cli.reranking``) and
    its ``rerank_NAME`` field of a search's body (``search.server.schema.Searching``) are built
    from it, and ``RerankOptions.checked`` refuses a value by it whoever gave it."""

    kind: type  # int, float or str: the flag's type, the body field's JSON type
    says: str  # what it does: the flag's help, the field's description
    default: str  # what leaving it out means: the flag's "Default: ...", the field's "Null: ..."
    metavar: str | None = None  # the flag's placeholder (None: its choices)
    choices: tuple[str, ...] = ()  # the names it takes, where it takes a few
    bounds: Callable[[Any, int], str | None] | None = None  # why a value is out of range at cutoff k
    loads: bool = False  # how the reranker loads (a kept one is keyed on it), not how a search reranks

    def refusal(self, value: object, k: int) -> str | None:
        """Why ``value`` is refused at cutoff ``k`` ("must be ..."), None where it is taken."""
        if self.choices and value not in self.choices:
            return f"must be {', '.join(self.choices[:-1])} or {self.choices[-1]}, not {value!r}"
        return None if self.bounds is None else self.bounds(value, k)


def tuning(**said: Any) -> Any:
    """A ``RerankOptions`` field tuning a named reranker: None unless given, ``Tuning(**said)``
    beside it."""
    return field(default=None, metadata={"tuning": Tuning(**said)})


def deep_enough(depth: int, k: int) -> str | None:
    """Why ``depth`` is no rerank depth at cutoff ``k``, None where it is one."""
    if k <= depth <= MAX_RERANK_DEPTH:
        return None
    return (
        f"must be at least k ({k}) and at most {MAX_RERANK_DEPTH}, not {depth}: the reranker "
        "re-orders the first stage's best of that many"
    )


def a_weight(weight: float, k: int) -> str | None:
    """Why ``weight`` is no fusion weight (``k`` changes nothing), None where it is one."""
    if 0 <= weight <= 1:  # NaN fails both
        return None
    return f"must be in [0, 1] (0: the first stage's order, 1: the reranker's), not {weight}"


@dataclass(frozen=True)
class RerankOptions:
    """What a caller asks of the rerank stage, carried whole from the CLI, Python and HTTP to the
    plan: a reranker's folder or Hub name (``model``; None: the engine's, or the index's default,
    where the caller has one, else none), how deep (``depth``; None: ``rerank_depth``), the weight
    its score is fused at (``weight``, in [0, 1]: 0 the first stage's order, 1 the reranker's;
    None: the index's fitted one, else the folder's), what runs it (``backend``: ``onnx``,
    ``onnx-int8`` or ``torch``; None: ``reranker_for``'s choice) and ``off`` (no reranking, not
    even the index's default). Checked once (``checked``), loaded once (``stage``). A new option
    of a named reranker is a field here made by ``tuning`` and the code that reads it: every
    caller's way to ask it is built from the field."""

    model: str | None = None
    depth: int | None = tuning(
        kind=int,
        metavar="N",
        says=f"How many of the first stage's best the reranker re-orders, at least k, at most "
        f"{MAX_RERANK_DEPTH}.",
        default=f"{RERANK_DEPTH} (k if more)",
        bounds=deep_enough,
    )
    weight: float | None = tuning(
        kind=float,
        metavar="W",
        says="The weight the reranker's score is fused with the first stage's at, in [0, 1]: 0 "
        "keeps the first stage's order, 1 the reranker's.",
        default="the one calibrate or tune fitted, else 1",
        bounds=a_weight,
    )
    backend: str | None = tuning(
        kind=str,
        choices=BACKENDS,
        says="What runs the reranker: onnx (ONNX Runtime, its graph exported once, then cached), "
        "onnx-int8 (int8 weights: faster on the CPU, scores slightly apart from "
        "CrossEncoder.predict) or torch.",
        default="onnx on the CPU (torch where no graph can be exported), torch on a GPU",
        loads=True,
    )
    off: bool = False

    def __post_init__(self) -> None:
        if self.model is not None:
            object.__setattr__(self, "model", str(self.model))

    @classmethod
    def asked(cls, rerank: object = True, **tuned: object) -> RerankOptions:
        """The options a Python or HTTP caller gives as ``rerank`` (a folder or name, options,
        True: the engine's, None or False: none) and ``rerank_NAME`` keywords (``TUNING``)."""
        named = {name.removeprefix("rerank_"): value for name, value in tuned.items() if value is not None}
        if isinstance(rerank, RerankOptions):
            return replace(rerank, **named)
        if rerank is None or rerank is False:
            return cls(off=True, **named)
        return cls(None if rerank is True else str(rerank), **named)

    def given(self, default: RerankOptions) -> RerankOptions:
        """These options, ``default``'s (the engine's own) where they say none: its reranker where
        they name none, and each option of it they leave out."""
        if self.off:
            return self
        unsaid = {name: getattr(default, name) for name in TUNING if getattr(self, name) is None}
        return replace(self, model=self.model or default.model, **unsaid)

    @property
    def folder(self) -> str | None:
        """The reranker a search reranks with (None: not reranked)."""
        return None if self.off else self.model

    def checked(self, k: int = 1, *, default: bool = False, cli: bool = False) -> RerankOptions:
        """These options if they go together at cutoff ``k``, else one line naming them as the
        caller does (``cli``: the flags; else the fields). ``default``: the index may name the
        reranker (a depth or weight alone is then its)."""
        tuned = [name for name in TUNING if getattr(self, name) is not None]
        if self.off and (self.model is not None or tuned):
            given = [spelled(name, cli) for name in ("model", *tuned) if getattr(self, name) is not None]
            raise BadInput(f"{spelled('off', cli)} takes no {' or '.join(given)}")
        if tuned and self.model is None and not default:
            reranker = "--rerank MODEL" if cli else "a reranker (rerank)"
            raise BadInput(f"{spelled(tuned[0], cli)} needs {reranker}")
        for name in tuned:
            refusal = TUNING[name].refusal(getattr(self, name), k)
            if refusal is not None:
                raise BadInput(f"{spelled(name, cli)} {refusal}")
        return self

    @property
    def engine(self) -> str | bool:
        """Which reranker ``SearchEngine`` reranks with: the folder, True (the index's) or False (off)."""
        return False if self.off else self.model or True

    @property
    def loading(self) -> tuple[object, ...]:
        """The options that say how the reranker loads (``Tuning.loads``): with its folder, the key
        a loaded reranker is kept by, so that each is loaded once."""
        return tuple(getattr(self, name) for name, said in TUNING.items() if said.loads)

    def loaded_as(self, reranker: Reranker) -> RerankOptions:
        """These options as ``reranker``, loaded by them, answers them: its runtime by name (the
        one ``reranker_for`` chose where they named none), so that asking for it by name finds it."""
        return replace(self, backend=reranker.runtime)

    def load(self, options: EmbeddingOptions | None = None) -> Reranker:
        """The reranker these options name (``folder``), loaded as they say (``load_reranker``)."""
        if self.folder is None:
            raise ValueError("no reranker is named to load")
        return load_reranker(self.folder, options, self.backend)

    def stage(
        self,
        k: int = 1,
        *,
        reranker: Reranker | None = None,
        options: EmbeddingOptions | None = None,
        meta: Mapping[str, object] | None = None,
    ) -> Reranking | None:
        """The stage at cutoff ``k`` (None where no reranker is asked): ``reranker`` where loaded
        already (the engine's), else loaded here (``load_reranker``); its depth by
        ``rerank_depth``; fused at ``weight``, else the one the index ``meta`` fitted for it
        (``index_weight``), else its folder's."""
        if self.folder is None:
            return None
        loaded = reranker or self.load(options)
        weight = self.weight
        if weight is None and meta is not None:
            weight = index_weight(meta, loaded.folder.fingerprint)
        return Reranking(loaded, rerank_depth(k, self.depth), weight)


TUNING: dict[str, Tuning] = {
    option.name: option.metadata["tuning"] for option in fields(RerankOptions) if "tuning" in option.metadata
}
"""The options of a named reranker (depth, weight, backend), each with how it is asked: a
``RerankOptions`` field, a ``--rerank-NAME`` flag (``search.cli.reranking``), a ``rerank_NAME``
field of a search's body (``search.server.schema.Searching``) and keyword of
``SearchEngine.request``."""


def spelled(name: str, cli: bool) -> str:
    """How a caller names the rerank option ``name``: the CLI's flag, else the field."""
    if name == "model":
        return "--rerank" if cli else "rerank"
    if name == "off":
        return "--no-rerank" if cli else "rerank false"
    return f"--rerank-{name}" if cli else f"rerank_{name}"


@dataclass(frozen=True)
class Reranking:
    """The rerank stage of a search: the cross-encoder, how many of the first stage's best it
    re-orders (``depth``, at least k) and the weight its score is fused at (None: its folder's,
    ``CrossFolder.weight``)."""

    reranker: Reranker
    depth: int
    weight: float | None = None

    @property
    def fused_at(self) -> float:
        """The weight a hit's score is fused at."""
        return self.reranker.folder.weight if self.weight is None else self.weight


def score_pairs(reranker: Reranker, pairs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], float]:
    """(question, text) -> the reranker's score, each distinct pair scored once, all of them in
    the reranker's token-budget batches (``Reranker.score_pairs``)."""
    import numpy as np

    unique = list(dict.fromkeys(pairs))
    if not unique:
        return {}
    scores = np.asarray(reranker.score_pairs(unique), dtype=np.float64)
    return dict(zip(unique, scores.tolist(), strict=True))


def rerank_batch(
    questions: Sequence[str], firsts: Sequence[Ranking], texts: Mapping[int, str], reranking: Reranking
) -> list[tuple[Ranking, Ranking]]:
    """Each question's candidates (``firsts``: row id -> the first stage's score; ``texts``: row id
    -> text) after the rerank (``fused``), and row id -> the reranker's own score; the batch's
    pairs scored together, each once (``score_pairs``)."""
    import numpy as np

    pairs = [(q, texts[rowid]) for q, first in zip(questions, firsts, strict=True) for rowid in first]
    scored = score_pairs(reranking.reranker, pairs)
    return [
        fused(first, np.array([scored[(q, texts[r])] for r in first]), reranking.fused_at)
        for q, first in zip(questions, firsts, strict=True)
    ]


def fused(first: Ranking, own: np.ndarray, weight: float) -> tuple[Ranking, Ranking]:
    """Row id -> the score of each candidate of ``first`` (row id -> the first stage's score)
    given the reranker's ``own`` (in its order), fused at ``weight``, best first, equal scores in
    the first stage's order; and row id -> the reranker's own score."""
    import numpy as np

    if not first:
        return {}, {}
    pool = list(first)
    own = np.asarray(own, dtype=np.float64)
    scores = own if weight == 1.0 else weight * own + (1 - weight) * np.array(list(first.values()))
    order = np.argsort(-scores, kind="stable")
    return {pool[i]: float(scores[i]) for i in order}, dict(zip(pool, own.tolist(), strict=True))
