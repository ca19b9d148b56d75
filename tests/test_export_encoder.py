"""`semsearch export-encoder`: one ONNX model and its tokenizer.json that ONNX Runtime and
`tokenizers` alone (nothing of semsearch imported) turn into the index's own query vectors, for
every pooling, layer combinations, the special-token rule and fitted post-processing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from indexer import BadInput, Strategy, build_index, export_encoder
from indexer.writing.export import MARKER
from search.read.engine import SearchEngine
from tests.helpers import DATA, assert_clean_failure, real_sentences, run

pytest.importorskip("onnxruntime")

STRATEGIES = {
    "cls": {"pooling": "cls", "layers": (-1,)},
    "mean": {"pooling": "mean", "layers": (-2,)},
    "max-of-embeddings": {"pooling": "max", "layers": (0,)},
    "mean-max-skip-special": {"pooling": "mean-max", "layers": (-1,), "skip_special": True},
    "cls-skip-special-raw": {"pooling": "cls", "layers": (-1,), "skip_special": True, "normalize": False},
    "pooler": {"pooling": "pooler"},
    "concat-layers": {"pooling": "mean", "layers": (1, 3), "combine": "concat"},
    "mean-of-layers-whitened": {
        "pooling": "mean",
        "layers": (-3, -2, -1),
        "combine": "mean",
        "postprocess": "whiten",
        "whiten_dims": 16,
    },
    "sum-of-layers-centered": {
        "pooling": "max",
        "layers": (-1, -2),
        "combine": "sum",
        "postprocess": "center",
    },
    "e5-prefixes": {
        "pooling": "mean",
        "layers": (-1,),
        "query_prefix": "query: ",
        "passage_prefix": "passage: ",
    },
    "int8": {"pooling": "mean", "layers": (-1,), "backend": "onnx-int8"},
}

OUTSIDE = """
import json, sys
import numpy as np, onnxruntime
from tokenizers import Tokenizer

texts = json.loads(open(sys.argv[1], encoding="utf-8").read())
for directory in sys.argv[2:]:
    facts = json.loads(open(directory + "/semsearch-encoder.json", encoding="utf-8").read())
    tokenizer = Tokenizer.from_file(directory + "/tokenizer.json")
    tokenizer.enable_padding(pad_id=facts["pad_id"])
    # one batch, padded to its longest text; the graph cannot prepend the query prefix: done here
    batch = tokenizer.encode_batch([facts["query_prefix"] + text for text in texts])
    session = onnxruntime.InferenceSession(directory + "/model.onnx")
    feed = {
        "input_ids": np.array([e.ids for e in batch], dtype=np.int64),
        "attention_mask": np.array([e.attention_mask for e in batch], dtype=np.int64),
    }
    if "token_type_ids" in {i.name for i in session.get_inputs()}:
        feed["token_type_ids"] = np.zeros_like(feed["input_ids"])
    np.save(directory + "/vectors.npy", session.run(["sentence_embedding"], feed)[0])
semsearch = sorted({m.split(".")[0] for m in sys.modules} & {"indexer", "search", "torch", "transformers"})
assert not semsearch, semsearch
"""


def vectors_elsewhere(texts: list[str], exports: list[Path], tmp: Path) -> dict[Path, np.ndarray]:
    """Each export's vectors of ``texts``, made by a process of ONNX Runtime and tokenizers alone."""
    (tmp / "texts.json").write_text(json.dumps(texts), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-c", OUTSIDE, str(tmp / "texts.json"), *map(str, exports)],
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return {export: np.load(export / "vectors.npy") for export in exports}


class Exports(dict):
    """Strategy name -> an index of the demo FAQ on the tiny model, its export, and its query
    vectors of mixed-length texts as the index itself makes them; each built on first use (the
    inner loop's tests read three strategies, the slow test all of them)."""

    def __init__(self, root: Path, model: str):
        super().__init__()
        self.root, self.model, self.texts = root, model, real_sentences()[:120]

    def __missing__(self, name: str) -> tuple:
        import os

        os.environ["SEMSEARCH_CACHE"] = str(self.root / "cache")
        try:
            index = self.root / name
            strategy = Strategy(model=self.model, **STRATEGIES[name])
            build_index(DATA / "demo_faq.csv", index, strategy, text_fields=["question"])
            export = export_encoder(index, self.root / f"{name}-onnx")
            self[name] = (index, export, SearchEngine(index).snapshot.embed(self.texts))
        finally:
            del os.environ["SEMSEARCH_CACHE"]
        return self[name]


@pytest.fixture(scope="module")
def exported(tmp_path_factory, tiny_model):
    """The ``Exports`` of the tiny model, the texts they embedded, and their folder."""
    made = Exports(tmp_path_factory.mktemp("exports"), tiny_model)
    return made, made.texts, made.root


@pytest.mark.slow
def test_onnx_runtime_and_tokenizers_alone_reproduce_the_index_query_vectors(exported):
    built, texts, root = exported
    made = {name: built[name] for name in STRATEGIES}
    elsewhere = vectors_elsewhere(texts, [export.directory for _, export, _ in made.values()], root)
    for name, (_, export, expected) in made.items():
        assert export.dimension == expected.shape[1], name
        np.testing.assert_allclose(elsewhere[export.directory], expected, atol=1e-5, err_msg=name)


def test_token_type_ids_feed_the_network_as_in_transformers(exported, tiny_model):
    """The export's ``token_type_ids`` is the model's own input (not ignored): segment 1 gives
    transformers' segment-1 vectors."""
    import onnxruntime
    import torch
    from tokenizers import Tokenizer
    from transformers import BertModel

    made, texts, _ = exported
    _, export, _ = made["cls"]
    assert export.inputs == ["input_ids", "attention_mask", "token_type_ids"]
    tokenizer = Tokenizer.from_file(str(export.directory / "tokenizer.json"))
    tokenizer.enable_padding(pad_id=0)
    batch = tokenizer.encode_batch(texts[:8])
    ids = np.array([e.ids for e in batch], dtype=np.int64)
    mask = np.array([e.attention_mask for e in batch], dtype=np.int64)
    ones = np.ones_like(ids)
    session = onnxruntime.InferenceSession(str(export.directory / "model.onnx"))
    feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": ones}
    got = session.run(["sentence_embedding"], feed)[0]
    with torch.no_grad():
        out = BertModel.from_pretrained(tiny_model).eval()(
            input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), token_type_ids=torch.tensor(ones)
        )
    cls = out.last_hidden_state[:, 0].numpy()
    np.testing.assert_allclose(got, cls / np.linalg.norm(cls, axis=1, keepdims=True), atol=1e-5)


def test_the_export_says_what_it_is_and_replaces_only_an_earlier_export(exported, tmp_path):
    made, _, _ = exported
    index, export, expected = made["mean-of-layers-whitened"]
    facts = json.loads((export.directory / MARKER).read_text(encoding="utf-8"))
    assert facts["dimension"] == 16 and facts["output"] == "sentence_embedding"
    readme = (export.directory / "README.md").read_text(encoding="utf-8")
    assert "`sentence_embedding`: float32 `[batch, 16]`, unit length" in readme
    again = export_encoder(index, export.directory)  # an earlier export: replaced whole
    assert sorted(p.name for p in again.directory.iterdir()) == sorted(again.files)
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me", encoding="utf-8")
    with pytest.raises(BadInput, match="refusing to overwrite"):
        export_encoder(index, foreign)
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # nothing half-written left


def test_the_export_states_the_prefixes_the_graph_cannot_prepend(exported):
    made, _, _ = exported
    prefixed = made["e5-prefixes"][1].directory
    facts = json.loads((prefixed / MARKER).read_text(encoding="utf-8"))
    assert (facts["query_prefix"], facts["passage_prefix"]) == ("query: ", "passage: ")
    readme = (prefixed / "README.md").read_text(encoding="utf-8")
    assert "put `'query: '` before each query and `'passage: '` before each" in readme
    assert "['query: ' + text for text in" in readme
    plain = (made["cls"][1].directory / "README.md").read_text(encoding="utf-8")
    assert "Prefixes" not in plain and "+ text for text" not in plain


def test_an_int8_index_exports_its_int8_graph_batched_as_the_index_embeds(exported):
    """An int8 graph quantises each token with its own scale: one padded batch through the export
    gives the index's own query vectors (not the fp32 ones)."""
    import onnxruntime
    from tokenizers import Tokenizer

    made, texts, _ = exported
    _, export, expected = made["int8"]
    _, _, fp32 = made["mean"]
    tokenizer = Tokenizer.from_file(str(export.directory / "tokenizer.json"))
    tokenizer.enable_padding(pad_id=0)
    batch = tokenizer.encode_batch(texts[:40])
    feed = {
        "input_ids": np.array([e.ids for e in batch], dtype=np.int64),
        "attention_mask": np.array([e.attention_mask for e in batch], dtype=np.int64),
        "token_type_ids": np.zeros((len(batch), len(batch[0].ids)), dtype=np.int64),
    }
    session = onnxruntime.InferenceSession(str(export.directory / "model.onnx"))
    got = session.run(["sentence_embedding"], {i.name: feed[i.name] for i in session.get_inputs()})[0]
    np.testing.assert_allclose(got, expected[:40], atol=1e-5)
    assert np.abs(expected - fp32).max() > 1e-3  # it is the int8 graph: other vectors than fp32


@pytest.mark.slow
def test_the_bundled_model_whitened_exports_from_the_command_line(tmp_path, monkeypatch):
    monkeypatch.setenv("SEMSEARCH_CACHE", str(tmp_path / "cache"))
    index = tmp_path / "faq"
    # whitened to 128 of 384 dimensions: whitening all 384 on these 211 texts magnifies float
    # rounding so much that the index's own vectors of one query differ by 2.6e-5 between a batch
    # and alone (docs/export-encoder.md)
    whitened = Strategy(postprocess="whiten", whiten_dims=128)
    build_index(DATA / "demo_faq.csv", index, whitened, text_fields=["question"])
    done = run("export-encoder", index, "-o", tmp_path / "faq-onnx")
    assert done.returncode == 0, done.stderr
    assert "sentence_embedding [batch, 128]" in done.stderr
    texts = real_sentences()
    expected = SearchEngine(index).snapshot.embed(texts)
    elsewhere = vectors_elsewhere(texts, [tmp_path / "faq-onnx"], tmp_path)[tmp_path / "faq-onnx"]
    np.testing.assert_allclose(elsewhere, expected, atol=1e-5)


@pytest.mark.slow
def test_bad_input_gets_one_line(tmp_path):
    assert_clean_failure(run("export-encoder", tmp_path / "none", "-o", tmp_path / "out"), "no index at")
    (tmp_path / "file").write_text("x", encoding="utf-8")
    assert_clean_failure(
        run("export-encoder", tmp_path / "none", "-o", tmp_path / "file"), "exists and is not a directory"
    )
