"""A sentence-transformers folder is read as its authors saved it: semsearch's vectors equal the
installed sentence-transformers' ``encode_query`` / ``encode_document`` (normalised) to 1e-4, for
each architecture, pooling mode, with and without a Dense module, the folder's prompts included,
in today's format and the one before sentence-transformers 5, on torch and on ONNX Runtime.
Tiny random models (``tests.helpers.random_encoder``) saved by sentence-transformers itself."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from indexer.embedding.strategy import Strategy
from indexer.encoders.factory import encoder_for
from indexer.errors import BadInput
from tests.helpers import ARCHITECTURES, random_encoder, run, sentence_transformers_folder

TEXTS = ["the bike station near the river", "a broken lock", "billing questions about the app and the map"]
PROMPTS = {"query": "query: ", "document": "passage: "}
POOLINGS = ["cls", "mean", "max", "mean_sqrt_len_tokens", "weightedmean", "lasttoken", ("mean", "max")]
INNER = {kind: POOLINGS[i % len(POOLINGS)] for i, kind in enumerate(ARCHITECTURES)}
"""The inner loop's cells: every architecture once, the pooling modes spread over them, with a
Dense module and the prompts."""


@pytest.fixture(scope="module")
def networks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("networks")
    return {kind: random_encoder(kind, root / kind) for kind in ARCHITECTURES}


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(autouse=True)
def shared_cache(cache, monkeypatch):
    """One graph cache for the module: a network's pooling variants share its graph."""
    monkeypatch.setenv("SEMSEARCH_CACHE", str(cache))


def reference(folder: str) -> tuple[np.ndarray, np.ndarray]:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(folder, device="cpu", local_files_only=True)
    return (
        model.encode_query(TEXTS, normalize_embeddings=True),
        model.encode_document(TEXTS, normalize_embeddings=True),
    )


def check(folder: str, backend: str, runtime: str) -> None:
    encoder = encoder_for(Strategy(model=folder, backend=backend))
    assert encoder.decision.runtime == runtime, encoder.decision.why
    queries, documents = reference(folder)
    np.testing.assert_allclose(encoder.embed(TEXTS, role="query"), queries, atol=1e-4)
    np.testing.assert_allclose(encoder.embed(TEXTS, role="passage"), documents, atol=1e-4)


def _name(pooling: str | tuple[str, ...]) -> str:
    return pooling if isinstance(pooling, str) else "+".join(pooling)


@pytest.mark.parametrize("kind", list(ARCHITECTURES))
def test_each_architecture_as_saved_equals_sentence_transformers_on_torch(networks, kind, tmp_path):
    folder = sentence_transformers_folder(
        networks[kind], tmp_path / kind, pooling=INNER[kind], dense=True, prompts=PROMPTS
    )
    check(folder, "torch", "torch")


@pytest.mark.parametrize("pooling", ["cls", "mean", "max"])
def test_a_folder_in_the_format_before_version_5_equals_sentence_transformers(networks, pooling, tmp_path):
    folder = sentence_transformers_folder(
        networks["bert"], tmp_path / "old", pooling=pooling, dense=True, prompts=PROMPTS, legacy=True
    )
    assert (Path(folder) / "2_Dense" / "pytorch_model.bin").is_file()
    check(folder, "torch", "torch")


def test_a_prefix_given_stands_over_the_models_prompt(networks, tmp_path):
    folder = sentence_transformers_folder(networks["bert"], tmp_path / "e5", prompts=PROMPTS)
    own = encoder_for(Strategy(model=folder, backend="torch"))
    assert (own.strategy.query_prefix, own.strategy.passage_prefix) == ("query: ", "passage: ")
    given = encoder_for(Strategy(model=folder, backend="torch", query_prefix="", passage_prefix="doc: "))
    assert (given.strategy.query_prefix, given.strategy.passage_prefix) == ("", "doc: ")


def test_another_pooling_or_layer_reads_the_network_alone(networks, tmp_path):
    folder = sentence_transformers_folder(networks["bert"], tmp_path / "dense", dense=True)
    own = encoder_for(Strategy(model=folder, backend="torch"))
    assert (own.strategy.modules, own.dimension) == (("2_Dense",), 24)
    other = encoder_for(Strategy(model=folder, backend="torch", pooling="mean"))
    assert (other.strategy.modules, other.dimension) == ((), 32)
    named = encoder_for(Strategy(model=folder, backend="torch", pooling="cls", layers=(3,)))  # the last
    assert (named.strategy.modules, named.dimension) == (("2_Dense",), 24)


def _rewrite(path: Path, change) -> None:
    path.write_text(json.dumps(change(json.loads(path.read_text()))))


def test_what_cannot_be_reproduced_is_refused_naming_it(networks, tmp_path):
    folder = Path(sentence_transformers_folder(networks["bert"], tmp_path / "odd", dense=True))
    _rewrite(folder / "modules.json", lambda m: [*m[:2], {**m[2], "type": "my_package.Projection"}, *m[3:]])
    with pytest.raises(BadInput, match=r"module 2_Dense \(my_package.Projection\) is code of its own"):
        encoder_for(Strategy(model=str(folder), backend="torch"))
    lstm = "sentence_transformers.models.LSTM"
    _rewrite(folder / "modules.json", lambda m: [*m[:2], {**m[2], "type": lstm}])
    with pytest.raises(BadInput, match=r"module 2_Dense \(sentence_transformers.models.LSTM\) is a module"):
        encoder_for(Strategy(model=str(folder), backend="torch"))


@pytest.mark.parametrize(
    "change, said",
    [
        ({"auto_map": {"AutoModel": "modeling.MyModel"}}, "needs code of its own"),
        ({"model_type": "t5", "is_encoder_decoder": True}, "is an encoder-decoder"),
        ({"model_type": "gpt2"}, "is a gpt2, not an architecture semsearch reads"),
        ({"model_type": "my-own"}, "is a my-own, not an architecture"),
    ],
)
def test_a_model_that_is_not_a_plain_encoder_is_refused_before_loading(networks, tmp_path, change, said):
    import shutil

    folder = tmp_path / "custom"
    shutil.copytree(networks["bert"], folder)
    _rewrite(folder / "config.json", lambda c: {**c, **change})
    with pytest.raises(BadInput, match=said):
        encoder_for(Strategy(model=str(folder), backend="torch"))


@pytest.mark.slow
def test_a_custom_code_model_is_refused_in_one_line_and_nothing_is_written(networks, tmp_path):
    import shutil

    folder = tmp_path / "custom"
    shutil.copytree(networks["bert"], folder)
    _rewrite(folder / "config.json", lambda c: {**c, "auto_map": {"AutoModel": "modeling.MyModel"}})
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    result = run("index", corpus, "-o", tmp_path / "index", "--model", folder, stdin="y\ny\ny\n")
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert [line for line in result.stderr.splitlines() if line.strip()] == [
        f"Error: model '{folder}' needs code of its own (auto_map in its config.json), and semsearch runs "
        "no downloaded code unless told: give --trust-remote-code if you trust it, or choose a model of "
        "a supported architecture (docs/models.md)"
    ]
    assert "custom code" not in result.stdout and not (tmp_path / "index").exists()


@pytest.mark.slow
@pytest.mark.parametrize("dense", [False, True], ids=["pooling", "dense"])
@pytest.mark.parametrize("kind", list(ARCHITECTURES))
def test_every_cell_equals_sentence_transformers_on_both_runtimes(networks, kind, dense, tmp_path):
    for pooling in POOLINGS:
        folder = sentence_transformers_folder(
            networks[kind], tmp_path / _name(pooling), pooling=pooling, dense=dense, prompts=PROMPTS
        )
        check(folder, "torch", "torch")
        check(folder, "onnx", "onnx")


@pytest.mark.slow
def test_an_index_of_a_dense_folder_answers_from_what_it_holds(networks, tmp_path):
    """The index holds the Dense module beside its graph: moved away from the model, it answers the same."""
    import shutil

    made = sentence_transformers_folder(networks["mpnet"], tmp_path / "model", dense=True, prompts=PROMPTS)
    folder = Path(made)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    assert run("index", corpus, "-o", tmp_path / "index", "--model", folder).returncode == 0
    info = run("info", tmp_path / "index").stdout
    said = "pooling cls, dense 32->24 tanh, normalize, prompts query 'query: ' passage 'passage: '"
    assert f"model_says:  {said}" in info
    before = run("query", tmp_path / "index", "a broken lock", "--json").stdout
    shutil.move(folder, tmp_path / "elsewhere")
    after = run("query", tmp_path / "index", "a broken lock", "--json")
    assert after.returncode == 0, after.stderr
    assert after.stdout == before
    assert run("info", tmp_path / "index", "--check").returncode == 0


@pytest.mark.slow
@pytest.mark.parametrize("pooling", ["mean_sqrt_len_tokens", "weightedmean", "lasttoken", "cls"])
def test_the_exported_encoder_holds_the_folders_pooling_and_dense(networks, pooling, tmp_path):
    """``export-encoder``'s one ONNX model gives sentence-transformers' query vectors (the prefix
    put before each text by its caller, as the export says)."""
    import onnxruntime
    from tokenizers import Tokenizer

    from indexer import build_index, export_encoder

    folder = sentence_transformers_folder(
        networks["electra"], tmp_path / "model", pooling=pooling, dense=True, prompts=PROMPTS
    )
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    build_index(corpus, tmp_path / "index", Strategy(model=folder))
    export = export_encoder(tmp_path / "index", tmp_path / "encoder")
    facts = json.loads((export.directory / "semsearch-encoder.json").read_text())
    tokenizer = Tokenizer.from_file(str(export.directory / "tokenizer.json"))
    tokenizer.enable_padding(pad_id=facts["pad_id"])
    batch = tokenizer.encode_batch([facts["query_prefix"] + text for text in TEXTS])
    session = onnxruntime.InferenceSession(str(export.directory / "model.onnx"))
    feed = {
        "input_ids": np.array([e.ids for e in batch], dtype=np.int64),
        "attention_mask": np.array([e.attention_mask for e in batch], dtype=np.int64),
    }
    if "token_type_ids" in {i.name for i in session.get_inputs()}:
        feed["token_type_ids"] = np.zeros_like(feed["input_ids"])
    vectors = session.run(["sentence_embedding"], feed)[0]
    np.testing.assert_allclose(vectors, reference(folder)[0], atol=1e-4)


def test_a_folder_with_dense_modules_is_not_tuned_through_them(networks, tmp_path):
    from indexer.encoders.training import trainable

    folder = sentence_transformers_folder(networks["bert"], tmp_path / "dense", dense=True)
    with pytest.raises(BadInput, match=r"Dense modules after pooling \(2_Dense\) cannot be tuned"):
        trainable(Strategy(model=folder))


def _folder(root: Path, modules: list, pooling: dict | None = None, **files: dict) -> str:
    """A folder of sentence-transformers files alone (what ``read_folder`` reads)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "modules.json").write_text(json.dumps(modules))
    if pooling is not None:
        (root / "1_Pooling").mkdir()
        (root / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    for name, content in files.items():
        (root / f"{name}.json").write_text(json.dumps(content))
    return str(root)


OLD = [
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
]


def test_what_each_format_says_is_read(tmp_path):
    from indexer.embedding.folder import read_folder

    flags = {"pooling_mode_cls_token": False, "pooling_mode_mean_tokens": False}
    assert read_folder(_folder(tmp_path / "none", OLD, flags)).pooling == "mean"  # as s-t reads it
    both = {"pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": True}
    assert read_folder(_folder(tmp_path / "both", OLD, both)).pooling == "mean-max"
    new = read_folder(
        _folder(
            tmp_path / "new",
            OLD,
            {"pooling_mode": ["lasttoken"]},
            sentence_bert_config={"max_seq_length": 77, "do_lower_case": True},
            config_sentence_transformers={"prompts": {"find": "Find: "}, "default_prompt_name": "find"},
        )
    )
    said = (new.pooling, new.max_length, new.lowercase, new.prompts)
    assert said == ("last-token", 77, True, ("Find: ", "Find: "))
    odd = read_folder(_folder(tmp_path / "odd", OLD, {"pooling_mode": {"weird": 1}}))
    assert odd.refused and "pools as" in odd.refused
    assert "not a module" in (read_folder(_folder(tmp_path / "bad", ["x"])).refused or "")
    assert read_folder(str(tmp_path)).refused is None and read_folder(str(tmp_path)).pooling is None


def test_a_sweep_of_a_dense_folder_runs_its_modules_only_in_its_own_cell(networks, tmp_path):
    from search.studies.evaluate import Pairs
    from search.studies.sweep import sweep_sts

    folder = sentence_transformers_folder(networks["bert"], tmp_path / "dense", pooling="mean", dense=True)
    pairs = Pairs(
        ["a cat", "a dog", "a car", "a map"],
        ["one cat", "one dog", "one bus", "the map"],
        np.array([5.0, 4, 3, 5]),
    )
    cells = sweep_sts(pairs, Strategy(model=folder))
    projected = [c.strategy for c in cells if c.strategy.modules]
    assert [(s.layers, s.pooling) for s in projected] == [((3,), "mean")]
    assert all(c.strategy.width is None for c in cells if not c.strategy.modules)
