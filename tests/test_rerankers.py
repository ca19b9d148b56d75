"""Rerankers (cross-encoders) read as their authors saved them: a tiny random one-label classifier
of every architecture semsearch reads, saved by the installed sentence-transformers'
``CrossEncoder`` (and in the formats before it), scores pairs on torch and on ONNX Runtime as
``CrossEncoder(path).predict`` does, to 1e-4 after its activation; a folder that is no reranker
is refused in one line before any weight is loaded."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from indexer.embedding.cross_folder import cross_graph, read_cross_folder
from indexer.encoders.options import EmbeddingOptions
from indexer.encoders.rerankers import reranker_for, spread
from indexer.errors import BadInput
from tests.helpers import ARCHITECTURES, heavy_imports, random_bert, random_cross_encoder

PAIRS = [
    ("how do I reset my password", "open the settings page and choose reset password"),
    ("how do I reset my password", "the bike station near the river has a broken lock"),
    ("where can I park a bike", "bikes park at the station by the river, free at night"),
    ("x", "y"),
    ("a question with many words in it, asked at length", "short"),
]
LONG = " ".join(["the bike station near the river has a broken lock and a map"] * 400)
"""Far past 128 tokens: truncated (the longest text first), and cut before tokenising."""


@pytest.fixture(autouse=True)
def own_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEMSEARCH_CACHE", str(tmp_path_factory.getbasetemp() / "reranker-cache"))


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., str]:
    """A tiny reranker (``random_cross_encoder``), built once a module per its arguments."""
    built: dict[tuple, str] = {}

    def make(arch: str = "bert", activation: str = "sigmoid", saved: str = "current") -> str:
        key = (arch, activation, saved)
        if key not in built:
            target = tmp_path_factory.mktemp(f"{arch}-{activation}-{saved}")
            built[key] = random_cross_encoder(target, arch, activation, saved=saved)
        return built[key]

    return make


def predicted(path: str, pairs: list[tuple[str, str]]) -> np.ndarray:
    """What sentence-transformers scores the pairs with: the reference."""
    from sentence_transformers import CrossEncoder

    return CrossEncoder(path, device="cpu").predict(pairs, batch_size=2)


def scored(path: str, runtime: str, pairs: list[tuple[str, str]], **options: object) -> np.ndarray:
    found = reranker_for(path, EmbeddingOptions(device="cpu", **options), runtime=runtime)  # type: ignore[arg-type]
    assert found.runtime == runtime
    return found.score_pairs(pairs)


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_each_architecture_scores_as_cross_encoder_predicts_on_torch(folder, arch):
    path = folder(arch, "identity")
    expected = predicted(path, PAIRS)
    assert np.ptp(expected) > 0.05  # the pairs score apart: equal scores would prove little
    np.testing.assert_allclose(scored(path, "torch", PAIRS), expected, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_each_architecture_scores_as_cross_encoder_predicts_on_onnx_runtime(folder, arch):
    path = folder(arch, "identity")
    np.testing.assert_allclose(scored(path, "onnx", PAIRS), predicted(path, PAIRS), atol=1e-4)


@pytest.mark.parametrize("runtime", ["torch", pytest.param("onnx", marks=pytest.mark.slow)])
@pytest.mark.parametrize(
    ("saved", "activation"),
    [
        ("current", "sigmoid"),
        ("current", "tanh"),
        ("legacy", "identity"),
        ("legacy", "sigmoid"),
        ("plain", "sigmoid"),
    ],
)
def test_each_format_and_activation_is_read_as_cross_encoder_reads_it(folder, saved, activation, runtime):
    from sentence_transformers import CrossEncoder

    path = folder("bert", activation, saved)
    said = read_cross_folder(path)
    reference = CrossEncoder(path, device="cpu")
    assert said.activation == activation and said.architecture == "BertForSequenceClassification"
    assert said.max_length == reference.max_seq_length
    pairs = [*PAIRS, ("where is the station", LONG), (LONG, LONG + " more")]
    np.testing.assert_allclose(scored(path, runtime, pairs), reference.predict(pairs), atol=1e-4)


def test_the_folders_length_and_prompt_are_read(folder, tmp_path):
    """``max_seq_length`` in the module's settings stands over the tokenizer's (uncapped, as
    sentence-transformers sets it), and the default prompt goes before each question."""
    from sentence_transformers import CrossEncoder

    path = tmp_path / "reranker"
    shutil.copytree(folder("bert", "identity"), path)
    settings = json.loads((path / "sentence_bert_config.json").read_text())
    (path / "sentence_bert_config.json").write_text(json.dumps({**settings, "max_seq_length": 16}))
    saved = json.loads((path / "config_sentence_transformers.json").read_text())
    said = {**saved, "prompts": {"query": "question: "}, "default_prompt_name": "query"}
    (path / "config_sentence_transformers.json").write_text(json.dumps(said))
    read = read_cross_folder(path)
    assert (read.max_length, read.prompt) == (16, "question: ")
    np.testing.assert_allclose(
        scored(str(path), "torch", PAIRS), CrossEncoder(str(path), device="cpu").predict(PAIRS), atol=1e-4
    )


def test_a_pair_is_truncated_on_the_tokenizers_side(folder, tmp_path):
    """A tokenizer that truncates on the left keeps each long text's end, as ``CrossEncoder`` does."""
    path = tmp_path / "reranker"
    shutil.copytree(folder("bert", "identity"), path)
    change(path, "tokenizer_config.json", truncation_side="left")
    ending = " ".join(f"word{i} near the river" for i in range(300))
    pairs = [("where is the station", ending), (ending, "short"), (ending, ending[::-1])]
    np.testing.assert_allclose(scored(str(path), "torch", pairs), predicted(str(path), pairs), atol=1e-4)
    right = scored(folder("bert", "identity"), "torch", pairs)
    assert not np.allclose(scored(str(path), "torch", pairs), right, atol=1e-3)  # the side matters


@pytest.mark.parametrize("runtime", ["torch", "onnx"])
def test_scores_do_not_depend_on_the_batch(folder, runtime):
    """Passes planned from token counts (one pair alone, or many at once, run side by side on
    ONNX Runtime) score each pair alike."""
    path = folder("bert", "identity")
    texts = [text for _, text in PAIRS] + [LONG[: 40 * i] for i in range(1, 12)]
    together = reranker_for(path, EmbeddingOptions(device="cpu", batch_size=32), runtime=runtime)
    alone = reranker_for(path, EmbeddingOptions(device="cpu", batch_size=1), runtime=runtime)
    expected = np.array([alone.score("a question", [text])[0] for text in texts])
    np.testing.assert_allclose(together.score("a question", texts), expected, atol=1e-5)


@pytest.mark.parametrize("rows", [[20], [3, 9, 8], [1, 1], [5], []])
@pytest.mark.parametrize("workers", [1, 2, 4])
def test_passes_are_cut_for_every_worker_keeping_each_pair_once(rows, workers):
    """One search's pairs reach every core: its passes cut (the largest halved) until each
    worker has one where a pass has rows to spare, each pair in exactly one pass."""
    starts = np.cumsum([0, *rows])
    planned = [np.arange(a, b) for a, b in zip(starts[:-1], starts[1:], strict=True)]
    passes = spread(planned, workers)
    assert sorted(np.concatenate([*passes, np.array([], dtype=int)]).tolist()) == list(range(sum(rows)))
    assert all(len(p) for p in passes)
    assert len(passes) == max(len(rows), min(workers, sum(rows)))


def test_calls_from_several_threads_at_once_score_as_one_call_alone(folder):
    """ONNX Runtime's passes run side by side on one session: calls made at once from several
    threads (in-process searches, each with its own passes) give each pair its score alone."""
    from concurrent.futures import ThreadPoolExecutor

    reranker = reranker_for(folder("bert", "identity"), EmbeddingOptions(device="cpu"), runtime="onnx")
    texts = [text for _, text in PAIRS] + [LONG[: 30 * i] for i in range(1, 9)]
    asked = [(question, texts[i:] + texts[:i]) for i, (question, _) in enumerate(PAIRS * 2)]
    alone = [reranker.score(question, found) for question, found in asked]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda one: reranker.score(*one), asked))
    for mine, expected in zip(together, alone, strict=True):
        np.testing.assert_allclose(mine, expected, atol=1e-6)


def test_a_batcher_scores_token_lists_as_score_does(folder):
    """``pair_tokens`` (tokenised as a request arrives; ``len``: its tokens) then ``score_tokens``
    (a batch of several requests' pairs) gives each pair the score ``score`` gives it."""
    reranker = reranker_for(folder("bert", "identity"), EmbeddingOptions(device="cpu"), runtime="torch")
    first = reranker.pair_tokens("how do I reset my password", ["open the settings", "x"])
    second = reranker.pair_tokens("where can I park a bike", ["at the station"])
    assert [len(t) for t in first] == [len(t.ids) for t in first] and len(first[1]) < len(first[0])
    batch = reranker.score_tokens([*first, *second])
    np.testing.assert_allclose(
        batch[:2], reranker.score("how do I reset my password", ["open the settings", "x"])
    )
    np.testing.assert_allclose(batch[2:], reranker.score("where can I park a bike", ["at the station"]))
    assert reranker.score("q", []).shape == (0,)


@pytest.mark.slow
def test_the_graph_is_exported_once_and_then_runs_without_torch(folder, tmp_path, monkeypatch):
    import subprocess
    import sys

    monkeypatch.setenv("SEMSEARCH_CACHE", str(tmp_path / "cache"))  # the next process's too
    path = folder("bert", "sigmoid")
    first = reranker_for(path, EmbeddingOptions(device="cpu"))
    assert (first.runtime, first.why) == ("onnx", "its graph was exported now (cached for the next time)")
    assert cross_graph(read_cross_folder(path)).exported
    script = (
        "import sys, json\n"
        "from indexer.encoders.rerankers import reranker_for, spread\n"
        f"r = reranker_for({path!r})\n"
        "print(json.dumps([r.runtime, r.why, 'torch' in sys.modules, r.score('q', ['a', 'b c']).tolist()]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    runtime, why, imported, scores = json.loads(done.stdout.strip().splitlines()[-1])
    assert (runtime, why, imported) == ("onnx", "its graph is cached", False)
    np.testing.assert_allclose(scores, first.score("q", ["a", "b c"]), atol=1e-6)


def test_a_classifier_that_cannot_be_exported_runs_on_torch_saying_why(folder, monkeypatch, tmp_path):
    from indexer.encoders import cross_export

    monkeypatch.setenv("SEMSEARCH_CACHE", str(tmp_path / "cache"))  # no graph of this network yet

    def refuse(*_: object) -> None:
        raise RuntimeError("an operator ONNX has not")

    monkeypatch.setattr(cross_export, "export_classifier", refuse)
    path = folder("distilbert", "sigmoid")
    reranker = reranker_for(path, EmbeddingOptions(device="cpu"))
    assert reranker.runtime == "torch" and "an operator ONNX has not" in reranker.why
    again = reranker_for(path, EmbeddingOptions(device="cpu"))  # the failure is noted: not retried
    assert again.runtime == "torch" and again.why == reranker.why
    np.testing.assert_allclose(reranker.score_pairs(PAIRS), predicted(path, PAIRS), atol=1e-4)


def change(path: Path, name: str, **changes: object) -> None:
    said = json.loads((path / name).read_text())
    (path / name).write_text(json.dumps({**said, **changes}))


def two_labels(path: Path) -> None:
    change(path, "config.json", id2label={"0": "no", "1": "yes"}, label2id={"no": 0, "yes": 1})


def no_separator(path: Path) -> None:
    tokenizer = json.loads((path / "tokenizer.json").read_text())
    tokenizer["post_processor"] = None
    (path / "tokenizer.json").write_text(json.dumps(tokenizer))


def bi_encoder(path: Path) -> None:
    shutil.rmtree(path)
    random_bert(path, layers=2)


def extra_module(path: Path) -> None:
    modules = json.loads((path / "modules.json").read_text())
    dense = {
        "idx": 1,
        "name": "1",
        "path": "1_Dense",
        "type": "sentence_transformers.base.modules.dense.Dense",
    }
    (path / "modules.json").write_text(json.dumps([*modules, dense]))


REFUSED: dict[str, tuple[Callable[[Path], object], tuple[str, ...]]] = {
    "no folder": (lambda p: shutil.rmtree(p), ("no model directory there",)),
    "two labels": (two_labels, ("one score per pair", "has 2 labels")),
    "a tokenizer that cannot take pairs": (no_separator, ("cannot take pairs", "tokenizer.json")),
    "a bi-encoder": (bi_encoder, ("not a reranker", "BertModel")),
    "not a model semsearch reads": (lambda p: change(p, "config.json", model_type="gpt2"), ("gpt2",)),
    "a decoder's classifier": (
        lambda p: change(p, "config.json", model_type="qwen3"),
        ("qwen3 classifier", "encoder architectures"),
    ),
    "code of its own": (lambda p: change(p, "config.json", auto_map={"x": "y.Z"}), ("code of its own",)),
    "an activation of its own": (
        lambda p: change(p, "config_sentence_transformers.json", activation_fn="mine.Activation"),
        ("activation 'mine.Activation'", "code of its own"),
    ),
    "an activation not applied": (
        lambda p: change(
            p, "config_sentence_transformers.json", activation_fn="torch.nn.modules.activation.GELU"
        ),
        ("GELU", "none semsearch applies"),
    ),
    "an activation named from elsewhere in torch": (
        lambda p: change(p, "config_sentence_transformers.json", activation_fn="torch.os.system.Sigmoid"),
        ("activation 'torch.os.system.Sigmoid'",),
    ),
    "a length past its positions": (
        lambda p: change(p, "sentence_bert_config.json", max_seq_length=100_000),
        ("length of 100000 tokens", "128 positions"),
    ),
    "a call length past its positions": (
        lambda p: change(p, "sentence_bert_config.json", processing_kwargs={"text": {"max_length": 129}}),
        ("length of 129 tokens", "128 positions"),
    ),
    "a module after the classifier": (extra_module, ("not one Transformer",)),
    "a module outside the folder": (
        lambda p: (p / "modules.json").write_text(json.dumps([{"path": "../x", "type": "t"}])),
        ("modules.json", "outside the model folder"),
    ),
    "a million layers": (
        lambda p: change(p, "config.json", num_hidden_layers=1_000_000),
        ("num_hidden_layers 1000000", "model.safetensors holds 2"),
    ),
    "weights linked to /etc/passwd": (
        lambda p: ((p / "model.safetensors").unlink(), (p / "model.safetensors").symlink_to("/etc/passwd")),
        ("model.safetensors", "not a safetensors file"),
    ),
    "a size the weights do not fit": (
        lambda p: change(p, "config.json", intermediate_size=100),
        ("model.safetensors", "do not fit the network its config.json describes"),
    ),
    "no weights": (lambda p: (p / "model.safetensors").unlink(), ("no weights there",)),
    "tokenizer nested deep": (
        lambda p: (p / "tokenizer.json").write_text("[" * 200_000 + "]" * 200_000),
        ("tokenizer.json", "nested too deep"),
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_folder_that_is_no_reranker_is_refused_in_one_line(folder, case, tmp_path):
    spoil, said = REFUSED[case]
    path = tmp_path / "reranker"
    shutil.copytree(folder("bert", "sigmoid"), path)
    spoil(path)
    with pytest.raises(BadInput) as refused:
        reranker_for(path, EmbeddingOptions(device="cpu"))
    line = str(refused.value)
    assert "\n" not in line and all(part in line for part in said), line


def test_a_runtime_is_onnx_onnx_int8_or_torch(folder):
    with pytest.raises(BadInput, match="onnx, onnx-int8 or torch, not 'tensorflow'"):
        reranker_for(folder("bert"), runtime="tensorflow")


def test_the_folder_reader_needs_no_torch():
    """The reader sits on the embedding floor: it reads the folder's files, never its weights."""
    root = Path(__file__).resolve().parents[1]
    assert heavy_imports(root / "indexer" / "embedding" / "cross_folder.py", ("torch", "transformers")) == []


LINES = ["open the settings page and choose reset password", "", "the bike station near the river", "x"]


def test_rerank_ranks_the_lines_of_a_file_best_first_by_the_rerankers_score(folder, tmp_path):
    """``semsearch rerank --json``: ids are the 1-based line numbers (blank lines left out),
    scores the reranker's, best first, at most k; the table without ``--json``."""
    from click.testing import CliRunner

    from search.cli import cli

    path = folder("bert", "identity")
    question = "how do I reset my password"
    lines = tmp_path / "texts.txt"
    lines.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    args = ["rerank", question, str(lines), "--model", path, "--backend", "torch", "--device", "cpu"]
    result = CliRunner().invoke(cli, [*args, "--json", "-k", "2"])
    assert result.exit_code == 0, result.output
    hits = json.loads(result.stdout)["hits"]
    kept = {1: LINES[0], 3: LINES[2], 4: LINES[3]}
    expected = dict(zip(kept, predicted(path, [(question, t) for t in kept.values()]).tolist(), strict=True))
    best = sorted(expected, key=expected.__getitem__, reverse=True)[:2]
    assert [h["id"] for h in hits] == [str(i) for i in best] and [h["rank"] for h in hits] == [1, 2]
    np.testing.assert_allclose([h["score"] for h in hits], [expected[i] for i in best], atol=1e-4)
    assert [h["text"] for h in hits] == [kept[i] for i in best]
    table = CliRunner().invoke(cli, args, input="\n".join(LINES))  # FILE "-": stdin
    assert table.exit_code == 0 and f"query: {question}" in table.output and LINES[2] in table.output


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["rerank", "q", "-", "--model", "{bi}"], "not a reranker"),
        (["rerank", "", "-", "--model", "{model}"], "empty"),
        (["rerank", "q", "-", "--model", "{model}", "--backend", "tensorflow"], "Invalid value"),
    ],
)
def test_rerank_refuses_in_one_line(folder, tiny_model, args, said):
    from click.testing import CliRunner

    from search.cli import cli

    given = [a.format(model=folder("bert"), bi=tiny_model) for a in args]
    result = CliRunner().invoke(cli, given, input="a line\n")
    assert result.exit_code != 0 and said in result.output and "Traceback" not in result.output, result.output


def test_python_rerank_takes_a_folder_or_a_reranker_made_once(folder):
    import semsearch

    path = folder("bert", "sigmoid")
    question, texts = PAIRS[0][0], [text for _, text in PAIRS]
    hits = semsearch.rerank(question, texts, model=path, options=semsearch.EmbeddingOptions(device="cpu"))
    expected = predicted(path, [(question, t) for t in texts])
    assert [h.id for h in hits] == [str(i + 1) for i in np.argsort(-expected, kind="stable")]
    np.testing.assert_allclose([h.score for h in hits], np.sort(expected)[::-1], atol=1e-4)
    reranker = semsearch.reranker_for(path, semsearch.EmbeddingOptions(device="cpu"), runtime="torch")
    again = semsearch.rerank(question, texts, model=reranker, k=2)
    assert [(h.id, h.rank) for h in again] == [(h.id, h.rank) for h in hits[:2]]
    with pytest.raises(BadInput, match="no non-empty lines"):
        semsearch.rerank(question, ["", "  "], model=reranker)
