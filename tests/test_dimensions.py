"""``--dimensions N`` (Matryoshka): each vector's first N dimensions, cut after pooling and the
folder's Dense modules and before normalising, equal to sentence-transformers'
``SentenceTransformer(path, truncate_dim=N)`` with ``normalize_embeddings`` on both runtimes;
stored with the index (its queries are cut the same), shown by ``info``, compared as part of the
strategy; OpenAI's ``dimensions`` on ``/v1/embeddings``; too many or too few refused in one line."""

from __future__ import annotations

import numpy as np
import pytest

from indexer.embedding.strategy import Strategy
from indexer.encoders.factory import encoder_for
from indexer.errors import BadInput
from tests.helpers import random_encoder, sentence_transformers_folder

TEXTS = ["the bike station near the river", "a broken lock", "billing questions about the app and the map"]
PROMPTS = {"query": "query: ", "document": "passage: "}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A tiny BERT saved by sentence-transformers: mean pooling alone (32 wide), and cls with a
    Dense module (24 wide), both with prompts and a Normalize module."""
    root = tmp_path_factory.mktemp("matryoshka")
    network = random_encoder("bert", root / "network")
    return {
        "mean": sentence_transformers_folder(network, root / "mean", pooling="mean", prompts=PROMPTS),
        "dense": sentence_transformers_folder(network, root / "dense", dense=True, prompts=PROMPTS),
    }


@pytest.fixture(autouse=True)
def own_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("SEMSEARCH_CACHE", str(tmp_path_factory.getbasetemp() / "dimensions-cache"))


def truncated(folder: str, dimensions: int) -> tuple[np.ndarray, np.ndarray]:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(folder, device="cpu", local_files_only=True, truncate_dim=dimensions)
    return (
        model.encode_query(TEXTS, normalize_embeddings=True),
        model.encode_document(TEXTS, normalize_embeddings=True),
    )


@pytest.mark.parametrize("backend", ["torch", "onnx"])
@pytest.mark.parametrize("kind, dimensions", [("mean", 16), ("mean", 1), ("dense", 8), ("dense", 24)])
def test_the_first_dimensions_equal_sentence_transformers_truncate_dim(folders, kind, dimensions, backend):
    encoder = encoder_for(Strategy(model=folders[kind], dimensions=dimensions, backend=backend))
    assert encoder.decision.runtime == backend, encoder.decision.why
    queries, documents = truncated(folders[kind], dimensions)
    assert encoder.embed(TEXTS).shape == (3, dimensions) == queries.shape
    np.testing.assert_allclose(encoder.embed(TEXTS, role="query"), queries, atol=1e-5)
    np.testing.assert_allclose(encoder.embed(TEXTS, role="passage"), documents, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(encoder.embed(TEXTS), axis=1), 1, atol=1e-6)


def test_more_dimensions_than_the_model_has_or_fewer_than_one_are_refused(folders):
    with pytest.raises(BadInput, match=r"^dimensions 25 exceeds this model's 24: give at most 24$"):
        encoder_for(Strategy(model=folders["dense"], dimensions=25, backend="torch"))
    with pytest.raises(BadInput, match=r"^dimensions 33 exceeds this model's 32"):
        encoder_for(Strategy(model=folders["mean"], dimensions=33, backend="torch"))
    for wrong in (0, -3, True, "8"):
        with pytest.raises(BadInput, match="dimensions must be a positive number"):
            Strategy(dimensions=wrong)  # type: ignore[arg-type]


def test_the_index_stores_shows_and_compares_its_dimensions(folders, tmp_path):
    from indexer import build_index
    from indexer.store import open_index
    from search.read.encoding import Encoding
    from search.read.engine import SearchEngine

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    build_index(corpus, tmp_path / "index", Strategy(model=folders["mean"], dimensions=12))
    stored = open_index(tmp_path / "index")
    assert stored.strategy.dimensions == 12 and stored.strategy.to_dict()["dimensions"] == 12
    assert "dimensions=12" in stored.strategy.describe()
    engine = SearchEngine(tmp_path / "index")
    np.testing.assert_allclose(engine.snapshot.embed(TEXTS), truncated(folders["mean"], 12)[0], atol=1e-5)
    assert engine.search("a broken lock", k=1)[0].text == "a broken lock"
    assert Encoding.load(index=tmp_path / "index").dimension == 12
    full = Strategy(model=folders["mean"]).to_dict()
    assert "dimensions" not in full  # a strategy without a cut is stored as before the field existed
    resolved = encoder_for(Strategy(model=folders["mean"]), queries=False).strategy
    assert "dimensions" in stored.strategy.differences(resolved)


def test_openai_dimensions_cut_the_served_vectors_and_too_many_is_a_400(folders):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from search.read.loading import load_encoding
    from search.server import create_app

    app = create_app(None, encoding=load_encoding(Strategy(model=folders["dense"], backend="torch")))
    with TestClient(app) as client:
        answer = client.post("/v1/embeddings", json={"input": TEXTS, "dimensions": 8})
        assert answer.status_code == 200, answer.text
        vectors = np.array([item["embedding"] for item in answer.json()["data"]], dtype=np.float32)
        np.testing.assert_allclose(vectors, truncated(folders["dense"], 8)[0], atol=1e-5)
        for wrong, said in ((25, "these vectors have 24, not 25: ask for at most 24"), (0, "dimensions")):
            refused = client.post("/v1/embeddings", json={"input": TEXTS, "dimensions": wrong})
            assert refused.status_code == 400, refused.text
            message = refused.json()["error"]["message"]
            assert said in message and "\n" not in message


@pytest.mark.slow
def test_the_cli_indexes_encodes_and_shows_the_dimensions(folders, tmp_path):
    from tests.helpers import run

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    built = run("index", corpus, "-o", tmp_path / "index", "--model", folders["dense"], "--dimensions", "8")
    assert built.returncode == 0, built.stderr
    assert "dimensions=8" in run("info", tmp_path / "index").stdout
    answered = run("query", tmp_path / "index", "a broken lock", "--json")
    assert answered.returncode == 0 and "a broken lock" in answered.stdout
    out = tmp_path / "vectors.npy"
    encoded = run("encode", corpus, "-o", out, "--model", folders["dense"], "--dimensions", "8")
    assert encoded.returncode == 0, encoded.stderr
    np.testing.assert_allclose(np.load(out), truncated(folders["dense"], 8)[0], atol=1e-5)
    for wrong in ("0", "25"):
        refused = run("encode", corpus, "--model", folders["dense"], "--dimensions", wrong)
        lines = [line for line in refused.stderr.splitlines() if line.strip()]
        assert refused.returncode != 0 and "Traceback" not in refused.stderr
        assert len(lines) <= 3 and "dimensions" in refused.stderr.lower(), refused.stderr


def test_the_exported_encoder_cuts_as_the_index_does(folders, tmp_path):
    import json

    import onnxruntime
    from tokenizers import Tokenizer

    from indexer import build_index, export_encoder

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    build_index(corpus, tmp_path / "index", Strategy(model=folders["dense"], dimensions=8))
    export = export_encoder(tmp_path / "index", tmp_path / "encoder")
    facts = json.loads((export.directory / "semsearch-encoder.json").read_text())
    assert facts["dimension"] == 8
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
    np.testing.assert_allclose(vectors, truncated(folders["dense"], 8)[0], atol=1e-5)


def test_a_cut_of_a_model_not_trained_for_it_is_noted_in_one_line(folders, tmp_path):
    """Truncation is meant for models trained for it (sentence-transformers' MatryoshkaLoss, which
    its model card names): a model that does not say so is cut all the same, with a note."""
    import shutil

    from click.testing import CliRunner

    from search.cli import cli

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    model = tmp_path / "model"
    shutil.copytree(folders["mean"], model)
    (model / "README.md").unlink(missing_ok=True)

    def encoded(*options: str) -> list[str]:
        command = ["encode", str(corpus), "-o", str(tmp_path / "v.npy"), "--model", str(model), *options]
        result = CliRunner().invoke(cli, command)
        assert result.exit_code == 0, result.output
        return [line for line in result.output.splitlines() if "trained for" in line]

    noted = encoded("--dimensions", "16")
    assert len(noted) == 1 and "does not say it was trained for cut vectors" in noted[0], noted
    assert np.load(tmp_path / "v.npy").shape == (3, 16)
    assert encoded() == []  # no cut, no note
    (model / "README.md").write_text("Trained with\n\n```\nMatryoshkaLoss\n```\n", encoding="utf-8")
    assert encoded("--dimensions", "16") == []
