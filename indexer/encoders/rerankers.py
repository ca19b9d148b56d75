"""Rerankers (cross-encoders): a question and a text read together by a classifier, one score per
pair, equal to sentence-transformers' ``CrossEncoder(path).predict(pairs)`` (after its activation)
to float error. The folder is read by ``indexer.embedding.cross_folder``; this module runs it.

``reranker_for(model, options, runtime=)`` is the one factory; every caller types the result as
``Reranker``:

- ``onnx`` (the default on the CPU): the classifier exported once into the graph cache
  (``indexer.encoders.cross_export``), then run on ONNX Runtime and ``tokenizers`` alone: once the
  graph is cached, no torch is imported. A model the exporter fails on is run on torch, and
  ``why`` says so (the failure is noted beside the graph, so it is not retried each time).
- ``onnx-int8`` (asked for, never a default): that fp32 graph rewritten to int8 once by the
  rewrite a sentence encoder's ``onnx-int8`` graph gets (``indexer.encoders.int8_graph``: int8
  weights, an activation scale per token, in this CPU's int8 format), cached beside it, keyed by
  the folder's files, the CPU's int8 format and the int8 recipe. Faster on the CPU; its scores
  differ slightly from ``CrossEncoder.predict`` (quantised: not float error), but a pair's score
  still does not depend on the pairs batched with it (each token has its own scale).
- ``torch``: ``AutoModelForSequenceClassification`` on torch, on the device the options place
  (a GPU's default).

Pairs are tokenised as ``CrossEncoder`` does, by the model's own ``tokenizer.json``: the folder's
prompt before the question, truncated to ``max_length`` longest text first (on the tokenizer's
truncation side), type ids where the network reads them; and scored in the passes
``indexer.embedding.batching.Batching.plan`` cuts from the pairs' token counts (on ONNX Runtime on
the CPU, side by side: ``onnx_graph.side_by_side``).

What a micro-batcher needs (the server batches pairs by token budget as it batches texts):
``pair_tokens(question, texts)`` tokenises a request as it arrives (a list of ``PairTokens``, whose
``len`` is its token count), ``score_tokens(tokens)`` scores any such list (a batch several
requests' pairs make, in the passes the batching rule plans), and ``batching.tokens`` is the
reranker's token budget for one batch. ``score`` and ``score_pairs`` are both of them in one call.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from indexer.embedding.batching import Batching
from indexer.embedding.cross_folder import CrossFolder, cross_graph, read_cross_folder
from indexer.embedding.graphs import GraphSpec
from indexer.embedding.head import pad_batch
from indexer.embedding.model_files import model_file, read_json
from indexer.embedding.models import CLASSIFIER, load_model
from indexer.encoders.devices import Placement
from indexer.encoders.onnx_graph import (
    CACHED,
    CPU,
    EXPORTED,
    RERANK,
    cannot_export,
    graph_step,
    session,
    side_by_side,
    usable_cores,
)
from indexer.encoders.options import EmbeddingOptions, given
from indexer.encoders.tokens import CHARS_PER_TOKEN, cut_text, token_text
from indexer.errors import BadInput, ModelFailed

RUNTIMES = ("onnx", "onnx-int8", "torch")
"""What runs a reranker: ONNX Runtime (the default on the CPU), ONNX Runtime in int8 (scores
slightly off ``CrossEncoder.predict``) or torch."""
ONNX = ("onnx", "onnx-int8")
ASKED = "torch asked for"
SAMPLE = (("how do I reset my password", "open the settings page"), ("a", "b"))
"""Two pairs of different lengths: the padded batch the classifier is traced with."""


@dataclass(frozen=True)
class PairTokens:
    """One pair as the network reads it: token ids and type ids (0 the question's, 1 the text's,
    as the tokenizer gives them). ``len``: its tokens, what a batch's budget counts."""

    ids: tuple[int, ...]
    types: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.ids)


Logits = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
"""``(input_ids, attention_mask, token_type_ids)`` (int64 ``[batch, tokens]``) -> logits ``[batch]``."""


class Reranker(Protocol):
    """What scores pairs: every caller types a reranker as this (``reranker_for`` makes one)."""

    folder: CrossFolder
    runtime: str
    """``onnx``, ``onnx-int8`` (int8: scores slightly off ``CrossEncoder.predict``) or ``torch``."""
    why: str
    """One line: why this runtime (asked for, graph cached, exported now, export failed...)."""
    batching: Batching

    def score(self, question: str, texts: Sequence[str]) -> np.ndarray:
        """float32, one per text, after the activation: ``CrossEncoder.predict`` of the pairs."""
        ...

    def score_pairs(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray: ...

    def pair_tokens(self, question: str, texts: Sequence[str]) -> list[PairTokens]: ...

    def score_tokens(self, tokens: Sequence[PairTokens]) -> np.ndarray: ...

    def first_tokens(self, texts: Sequence[str], count: int) -> list[str]:
        """Each text cut after its first ``count`` tokens (``PairTokenizer.first_tokens``)."""
        ...

    def close(self) -> None:
        """End the threads its passes run on: whoever loaded it closes it (``SearchEngine.close``)."""
        ...


class PairTokenizer:
    """The folder's ``tokenizer.json`` set up as ``CrossEncoder`` calls it for pairs (no
    transformers): truncation ``longest_first`` at ``max_length`` on the tokenizer's side, no padding."""

    def __init__(self, folder: CrossFolder):
        from tokenizers import Tokenizer

        location = folder.path
        self.tokenizer = Tokenizer.from_file(str(Path(location) / "tokenizer.json"))
        padding = self.tokenizer.padding or {}
        said = {
            **(read_json(model_file(location, "tokenizer_config.json")) or {}),
            **(read_json(model_file(location, "special_tokens_map.json")) or {}),
        }
        pad = token_text(said.get("pad_token"))
        found = self.tokenizer.token_to_id(pad) if pad else None
        self.pad = found if found is not None else int(padding.get("pad_id", 0))
        self.tokenizer.no_padding()
        self.max_length = folder.max_length
        self.left = said.get("truncation_side") == "left"
        if self.max_length is None:
            self.tokenizer.no_truncation()
        else:
            side = "left" if self.left else "right"
            self.tokenizer.enable_truncation(self.max_length, strategy="longest_first", direction=side)
        self.prompt, self.lowercase = folder.prompt, folder.lowercase

    def pairs(self, pairs: Sequence[tuple[str, str]]) -> list[PairTokens]:
        """Each pair's tokens. A text longer than ``max_length * CHARS_PER_TOKEN`` characters is cut
        (at a space) before tokenising where its cut still fills the window, so a line of any length
        costs the tokenizer the same and truncates to the same tokens."""
        cased = [(self.prompt + q, t) for q, t in pairs]
        if self.lowercase:
            cased = [(q.lower(), t.lower()) for q, t in cased]
        cut = [(self._bounded(q), self._bounded(t)) for q, t in cased]
        found = self.tokenizer.encode_batch(cut)
        return [PairTokens(tuple(e.ids), tuple(e.type_ids)) for e in found]

    def first_tokens(self, text: str, count: int) -> str:
        """``text`` up to the end of its first ``count`` tokens (special tokens aside), cut in the
        text at the tokenizer's offsets, so what is kept is the text as written (Cohere v2's
        ``max_tokens_per_doc``). Past ``max_length`` the pair's own truncation cuts it anyway."""
        lowered = text.lower() if self.lowercase else text
        read = lowered if len(lowered) == len(text) else text  # offsets must index ``text``
        offsets = self.tokenizer.encode(read, add_special_tokens=False).offsets
        return text[: offsets[count - 1][1]] if len(offsets) > count else text

    def _bounded(self, text: str) -> str:
        if self.max_length is None or self.left:
            return text
        bound = self.max_length * CHARS_PER_TOKEN
        if len(text) <= bound:
            return text
        cut = cut_text(text, bound)
        kept = len(self.tokenizer.encode(cut, add_special_tokens=False).ids)
        return cut if kept >= self.max_length else text


class _Scoring:
    """Pairs -> tokens -> planned passes -> logits -> the activation: what both runtimes share.
    ``workers``: passes run at once (``_OnnxClassifier.workers``; 1: one after the other)."""

    def __init__(
        self,
        folder: CrossFolder,
        runtime: str,
        why: str,
        batching: Batching,
        logits: Logits,
        workers: int = 1,
    ):
        self.folder, self.runtime, self.why, self.batching = folder, runtime, why, batching
        self.tokenizer = PairTokenizer(folder)
        self.logits, self.workers = logits, workers
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="semsearch-pass") if workers > 1 else None

    def pair_tokens(self, question: str, texts: Sequence[str]) -> list[PairTokens]:
        return self.tokenizer.pairs([(question, text) for text in texts])

    def score_tokens(self, tokens: Sequence[PairTokens]) -> np.ndarray:
        out = np.zeros(len(tokens), dtype=np.float32)
        planned = spread(self.batching.plan([len(t) for t in tokens]), self.workers)
        padded = [self._padded([tokens[i] for i in rows.tolist()]) for rows in planned]
        pool = self.pool  # read once: ``close`` may end it meanwhile
        run = pool.map if pool is not None and len(padded) > 1 else map
        for rows, logits in zip(planned, run(lambda batch: self.logits(*batch), padded), strict=True):
            out[rows] = logits
        if not np.isfinite(out).all():
            raise ModelFailed(
                f"the reranker {self.folder.path} gave non-finite scores: its weights are damaged"
            )
        return activated(out, self.folder.activation)

    def _padded(self, chosen: list[PairTokens]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        ids, mask = pad_batch([t.ids for t in chosen], self.tokenizer.pad)
        types, _ = pad_batch([t.types for t in chosen], 0)
        return ids, mask, types

    def score_pairs(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        return self.score_tokens(self.tokenizer.pairs(pairs))

    def first_tokens(self, texts: Sequence[str], count: int) -> list[str]:
        return [self.tokenizer.first_tokens(text, count) for text in texts]

    def score(self, question: str, texts: Sequence[str]) -> np.ndarray:
        return self.score_tokens(self.pair_tokens(question, texts))

    def close(self) -> None:
        """End the pass threads, which otherwise live as long as the process; a later call runs its
        passes one after another on the calling thread (its scores the same)."""
        pool, self.pool = self.pool, None
        if pool is not None:
            pool.shutdown()


def spread(passes: list[np.ndarray], workers: int) -> list[np.ndarray]:
    """``passes`` cut until there are ``workers`` of them where they can be (the largest halved,
    rows in its order): each worker gets a pass, so one search's pairs use every core. A pair's
    score does not depend on its pass."""
    passes = list(passes)
    while len(passes) < workers:
        largest = max(range(len(passes)), key=lambda i: len(passes[i]), default=None)
        if largest is None or len(passes[largest]) < 2:
            break
        rows = passes.pop(largest)
        passes[largest:largest] = [rows[: len(rows) // 2], rows[len(rows) // 2 :]]
    return passes


def activated(logits: np.ndarray, activation: str) -> np.ndarray:
    """The folder's activation of float32 logits, as ``CrossEncoder.predict`` applies it."""
    if activation == "sigmoid":
        return (1.0 / (1.0 + np.exp(-logits.astype(np.float64)))).astype(np.float32)
    if activation == "tanh":
        return np.tanh(logits).astype(np.float32)
    return logits


class _TorchClassifier:
    """The network on torch at a placement: its logits as NumPy."""

    def __init__(self, folder: CrossFolder, on: Placement):
        import torch

        from indexer.encoders.pipeline import DTYPES

        self.network, self.types = load_classifier(folder)
        self.device = torch.device(on.device)
        self.network = self.network.to(device=self.device, dtype=DTYPES[on.precision]).eval()

    def __call__(self, ids: np.ndarray, mask: np.ndarray, types: np.ndarray) -> np.ndarray:
        import torch

        given = {
            "input_ids": ids,
            "attention_mask": mask,
            **({"token_type_ids": types} if self.types else {}),
        }
        with torch.inference_mode():
            tensors = {k: torch.from_numpy(v).to(self.device) for k, v in given.items()}
            return self.network(**tensors).logits[:, 0].float().cpu().numpy()


def load_classifier(folder: CrossFolder) -> tuple[Any, bool]:
    """The folder's classifier on torch (eval mode, CPU) from disk only, loaded as every network is
    (``load_model`` for its task, with its refusals), and whether it reads type ids (its forward
    takes them and its tokenizer gives them, as ``CrossEncoder`` passes them)."""
    tokenizer, network = load_model(folder.path, task=CLASSIFIER)
    reads = "token_type_ids" in inspect.signature(network.forward).parameters
    return network, reads and "token_type_ids" in tokenizer.model_input_names


class _OnnxClassifier:
    """The exported classifier on ONNX Runtime (no torch): it is fed the inputs it names.

    On the CPU its passes run side by side, each on ``threads`` cores (``side_by_side``): on 2 cores two
    one-thread runs at once score about 1.5x the pairs/s of one two-thread run at a time when the
    cores are shared (a server's event loop, its clients, other processes), since a run's
    operators wait on the slowest of its threads at every step (docs/rerank.md). One session:
    ONNX Runtime runs it from several threads at once, its weights held once."""

    def __init__(self, spec: GraphSpec, provider: str = CPU, spin: bool = False):
        self.workers, threads = side_by_side(RERANK) if provider == CPU else (1, usable_cores())
        self.session = session(spec.path, provider=provider, spin=spin and threads > 1, threads=threads)
        self.inputs = {i.name for i in self.session.get_inputs()}

    def __call__(self, ids: np.ndarray, mask: np.ndarray, types: np.ndarray) -> np.ndarray:
        feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        (logits,) = self.session.run(None, {k: v for k, v in feed.items() if k in self.inputs})
        return logits[:, 0].astype(np.float32)


def reranker_for(
    model: str | Path, options: EmbeddingOptions | None = None, *, runtime: str | None = None
) -> Reranker:
    """The reranker of the folder at ``model`` (``read_cross_folder``), on ``runtime`` (``onnx``,
    ``onnx-int8`` or ``torch``; None: ONNX Runtime on the CPU, torch on a GPU the options place
    it on), as the module doc says; ``options``: the device, batch size and execution provider.
    On ``onnx-int8`` the scores differ slightly from ``CrossEncoder.predict`` (int8 weights and
    activations); ``runtime`` of the result says which ran (torch where no graph can be had)."""
    options = given(options)
    if runtime is not None and runtime not in RUNTIMES:
        said = f"{', '.join(RUNTIMES[:-1])} or {RUNTIMES[-1]}"
        raise BadInput(f"a reranker runs on {said}, not {runtime!r}")
    folder = read_cross_folder(model)
    on = options.placement
    if runtime in ONNX and not on.on_cpu and options.provider is None:
        raise BadInput(
            f"ONNX Runtime runs rerankers on the CPU here, not {on.device}: give --device cpu or torch"
        )
    if runtime == "torch" or (runtime is None and not on.on_cpu):
        why = ASKED if runtime == "torch" else f"{on.describe()} asked for"
        return _torch(folder, options, why)
    int8 = runtime == "onnx-int8"
    spec = cross_graph(folder, int8=int8)
    step, failure = graph_step(spec, retry=False)  # the ladder a sentence encoder's graph climbs
    if step == "export":
        failure = quantise(folder, spec) if int8 else export(folder, spec)
    if failure is not None:
        return _torch(folder, options, cannot_export(failure))
    classifier = _OnnxClassifier(spec, options.provider or CPU, not options.serving)
    why = CACHED if step == "cached" else EXPORTED
    batching = Batching.on(True, options.batch_size)
    runtime = "onnx-int8" if int8 else "onnx"
    return _Scoring(folder, runtime, why, batching, classifier, classifier.workers)


def _torch(folder: CrossFolder, options: EmbeddingOptions, why: str) -> _Scoring:
    on = options.placement
    batching = Batching.on(on.on_cpu, options.batch_size, runtime="torch")
    return _Scoring(folder, "torch", why, batching, _TorchClassifier(folder, on))


def export(folder: CrossFolder, spec: GraphSpec) -> str | None:
    """Export the folder's classifier into ``spec``'s place as every graph is exported
    (``export_noted``: on failure the reason is noted beside it, the reranker runs on torch, and
    nothing retries) and return the reason, or None."""
    import torch

    from indexer.encoders import cross_export
    from indexer.encoders.onnx_export import export_noted

    network, types = load_classifier(folder)
    tokens = PairTokenizer(folder).pairs(SAMPLE)
    ids, mask = pad_batch([t.ids for t in tokens], 0)
    type_ids, _ = pad_batch([t.types for t in tokens], 0)
    sample = [torch.from_numpy(a) for a in (ids, mask, type_ids)]
    return export_noted(spec, lambda: cross_export.export_classifier(network, spec, sample, types))


def quantise(folder: CrossFolder, spec: GraphSpec) -> str | None:
    """Make the int8 classifier ``spec`` from the folder's fp32 graph (exported first where the
    cache lacks it) by the int8 rewrite every int8 graph gets (``onnx_export.int8_rewrite``), noted
    on failure as an export is; return the reason, or None."""
    from indexer.encoders.onnx_export import export_noted, int8_rewrite, rewrite_graph

    source = cross_graph(folder)
    step, failure = graph_step(source, retry=False)
    if step == "export":
        failure = export(folder, source)
    if failure is not None:
        return failure
    return export_noted(spec, lambda: rewrite_graph(source, spec, int8_rewrite(spec.int8)))
