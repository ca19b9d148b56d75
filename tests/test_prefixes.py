"""Query and passage prefixes (``--query-prefix`` / ``--passage-prefix``): a query is embedded as
``query_prefix + text`` and an indexed text as ``passage_prefix + text``, by every encoder and every
surface, stored with the strategy; an index written before them reads as empty prefixes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from indexer.embedding.strategy import Strategy
from indexer.errors import BadInput
from tests.helpers import assert_clean_failure, build_faq, run, torch_reference

E5 = {"query_prefix": "query: ", "passage_prefix": "passage: "}
TEXTS = ["How do I pay for a ride?", "a bike"]


@pytest.fixture(scope="module")
def plain_and_prefixed(tiny_model):
    """Torch encoders of the tiny model without and with e5's prefixes, sharing one loaded model."""

    plain = torch_reference(Strategy(model=tiny_model, backend="torch"))
    prefixed = torch_reference(Strategy(model=tiny_model, backend="torch", **E5), loaded=plain.loaded)
    return plain, prefixed


def test_queries_and_passages_are_the_vectors_of_their_prefixed_texts(plain_and_prefixed):
    plain, prefixed = plain_and_prefixed
    asked = plain.embed([f"query: {t}" for t in TEXTS])
    entries = plain.embed([f"passage: {t}" for t in TEXTS])
    np.testing.assert_allclose(prefixed.embed(TEXTS), asked, atol=1e-6)
    np.testing.assert_allclose(prefixed.embed(TEXTS, role="passage"), entries, atol=1e-6)
    vectors, owners = prefixed.embed_documents(TEXTS)
    np.testing.assert_allclose(vectors, entries, atol=1e-6)
    assert owners.tolist() == [0, 1]
    assert not np.allclose(asked, plain.embed(TEXTS), atol=1e-3)  # the prefix changes the vectors


def test_each_window_of_a_chunked_passage_starts_with_the_prefix(tiny_model):

    plain = torch_reference(Strategy(model=tiny_model, backend="torch", max_length=16))
    chunked = torch_reference(
        Strategy(model=tiny_model, backend="torch", max_length=16, chunk_overlap=4, **E5), loaded=plain.loaded
    )
    text = " ".join(f"word{i}" for i in range(40))
    pieces = chunked.tokens.documents([text]).ids
    prefix = plain.tokens.ids(["passage:"])[0][1:-1]
    assert len(pieces) > 2
    assert all(len(p) <= 16 and p[1 : 1 + len(prefix)] == prefix for p in pieces)
    vectors, owners = chunked.embed_documents([text])
    # the first window is the prefixed text truncated at max_length
    np.testing.assert_allclose(vectors[0], plain.embed([f"passage: {text}"])[0], atol=1e-6)
    assert owners.tolist() == [0] * len(pieces)


def test_a_prefix_that_fills_the_window_is_one_clear_line(tiny_model):

    long = "represent this sentence for searching relevant passages " * 4
    with pytest.raises(BadInput, match="query prefix .* takes 16 or more of the model's 16-token window"):
        torch_reference(Strategy(model=tiny_model, backend="torch", max_length=16, query_prefix=long))


@pytest.mark.parametrize("role", ["query", "passage"])
def test_a_prefix_may_take_at_most_half_the_window(tiny_model, role):
    """Nine of sixteen tokens are refused, eight (half) are not: a prefix that took nearly the
    whole window left each text a token or two, and every entry nearly one vector."""
    from indexer.encoders.tokens import TextTokenizer

    def tokenizer(prefix: str) -> TextTokenizer:
        return TextTokenizer.from_files(tiny_model, Strategy(max_length=16, **{f"{role}_prefix": prefix}))

    half = tokenizer("a b c d e f g h ")
    assert len(half.ids(["bike"], role)[0]) == 11  # [CLS], 8 prefix tokens, the text, [SEP]
    with pytest.raises(BadInput, match=rf"^the {role} prefix .* takes 9 of the model's 16-token window; "
                       r"a prefix may take at most half \(8\)"):
        tokenizer("a b c d e f g h i ")


@pytest.mark.parametrize("role", ["query", "passage"])
def test_a_prefix_that_swallows_the_word_after_it_is_refused_not_the_text(tiny_model, role):
    """A prefix whose last word is 100 characters: glued to any word after it, WordPiece reads one
    unknown word, so every one-word text was the prefix alone and was refused as having no tokens."""
    from indexer.encoders.tokens import TextTokenizer

    prefix = "find: " + "x" * 100
    with pytest.raises(BadInput, match=rf"^the {role} prefix ending '.*x' swallows the word after it"):
        TextTokenizer.from_files(tiny_model, Strategy(**{f"{role}_prefix": prefix}))
    spaced = TextTokenizer.from_files(tiny_model, Strategy(**{f"{role}_prefix": prefix + " "}))
    assert spaced.ids(["bike"], role) != spaced.ids(["ride"], role)


def test_prefixes_are_stored_compared_and_described():
    strategy = Strategy(**E5)
    assert Strategy.from_dict(strategy.to_dict()) == strategy
    assert Strategy().differences(strategy) == ["query_prefix", "passage_prefix"]
    assert "query_prefix='query: ' passage_prefix='passage: '" in strategy.describe()
    assert "prefix" not in Strategy().describe()
    none = Strategy(query_prefix="", passage_prefix="")  # resolved on a model without prompts
    old = {k: v for k, v in none.to_dict().items() if not k.endswith("_prefix")}
    assert Strategy.from_dict(old) == none  # an index from before prefixes: none, same strategy
    assert Strategy.from_dict(old).to_dict() == old == none.to_dict()  # and stored as it was
    with pytest.raises(BadInput, match="not 'answer'"):
        strategy.prefix("answer")


def test_an_index_embeds_its_entries_and_queries_with_their_prefixes(tmp_path, tiny_model):
    from search.read.encoding import Encoding, encode
    from search.read.engine import SearchEngine

    index = build_faq(tmp_path, tiny_model, **E5)
    plain = Encoding.load(Strategy(model=tiny_model))
    np.testing.assert_allclose(
        encode(TEXTS, index=index), plain.encode([f"query: {t}" for t in TEXTS]), atol=1e-5
    )
    np.testing.assert_allclose(
        encode(TEXTS, index=index, as_="passage"), plain.encode([f"passage: {t}" for t in TEXTS]), atol=1e-5
    )
    np.testing.assert_allclose(
        SearchEngine(index).snapshot.embed(TEXTS), encode(TEXTS, index=index), atol=1e-6
    )
    # an entry's own text, asked as a query, still finds it: both sides read with their prefixes
    hits = SearchEngine(index).search("How do I pay for a ride?", k=1)
    assert hits[0].id == "a1"

    with pytest.raises(BadInput, match="query, passage"):
        encode(TEXTS, index=index, as_="document")


@pytest.mark.slow
def test_the_cli_takes_prefixes_shows_them_and_encodes_as_passages(tmp_path, tiny_model):
    from search.read.encoding import Encoding

    index, corpus, out = tmp_path / "idx", tmp_path / "faq.txt", tmp_path / "v.jsonl"
    corpus.write_text("How do I pay for a ride?\na bike\n", encoding="utf-8")
    prefixes = ("--query-prefix", "query: ", "--passage-prefix", "passage: ")
    built = run("index", corpus, "-o", index, "--model", tiny_model, *prefixes)
    assert built.returncode == 0, built.stderr
    info = run("info", index)
    assert "query_prefix='query: ' passage_prefix='passage: '" in info.stdout, info.stderr
    encoded = run("encode", "-", "--index", index, "--as", "passage", "-o", out, stdin="a bike\n")
    assert encoded.returncode == 0, encoded.stderr
    plain = Encoding.load(Strategy(model=tiny_model))
    vector = json.loads(out.read_text())["vector"]
    np.testing.assert_allclose(vector, plain.encode(["passage: a bike"])[0], atol=1e-5)

    long = "represent this sentence for searching relevant passages " * 4
    asked = ("--max-length", "16", "--passage-prefix", long)
    assert_clean_failure(
        run("encode", "-", "--model", tiny_model, *asked, stdin="a bike\n"), "passage prefix"
    )


def test_the_encode_endpoints_take_an_input_type(tmp_path, tiny_model):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from search.read.encoding import Encoding
    from search.server import create_app

    index = build_faq(tmp_path, tiny_model, **E5)
    plain = Encoding.load(Strategy(model=tiny_model))
    with TestClient(create_app(index)) as client:
        asked = client.post("/encode", json={"texts": TEXTS}).json()["vectors"]
        entries = client.post("/encode", json={"texts": TEXTS, "input_type": "passage"}).json()["vectors"]
        openai = client.post("/v1/embeddings", json={"input": TEXTS, "input_type": "passage"}).json()
        bad = client.post("/encode", json={"texts": TEXTS, "input_type": "document"})
    np.testing.assert_allclose(asked, plain.encode([f"query: {t}" for t in TEXTS]), atol=1e-5)
    np.testing.assert_allclose(entries, plain.encode([f"passage: {t}" for t in TEXTS]), atol=1e-5)
    np.testing.assert_allclose([d["embedding"] for d in openai["data"]], entries, atol=1e-6)
    assert bad.status_code == 400


def test_a_sweep_embeds_entries_as_passages_and_questions_as_queries(plain_and_prefixed, tiny_model):

    plain, _ = plain_and_prefixed
    grid = torch_reference(
        Strategy(model=tiny_model, backend="torch", **E5), all_layers=True, loaded=plain.loaded
    )
    cell = grid.strategy
    for role in ("query", "passage"):
        (vectors,) = grid.embed_grid(TEXTS, [cell], role=role)
        np.testing.assert_allclose(vectors, plain.embed([f"{role}: {t}" for t in TEXTS]), atol=1e-6)
