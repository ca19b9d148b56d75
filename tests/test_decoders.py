"""Decoder embedders (Qwen2/Qwen3, Mistral/Llama, Gemma 2, EmbeddingGemma's bidirectional Gemma 3)
read from sentence-transformers folders as their authors save them: semsearch's query and passage
vectors equal the installed sentence-transformers' ``encode_query`` / ``encode_document``
(normalised) to 1e-4 on torch and on the exported ONNX graph, with last-token or mean pooling, the
tokenizer's padding side (Qwen's left), the end-of-text token it appends, the folder's prompts and
EmbeddingGemma's two Dense modules. Tiny random models, their tokenizers trained here."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from indexer.embedding.strategy import Strategy
from indexer.encoders.factory import encoder_for
from tests.helpers import DECODERS, decoder_folder, decoder_tokenizer, random_decoder

TEXTS = [
    "the bike station near the river is closed on sundays",
    "a broken lock",
    "billing questions about the app and the map, and how the monthly plan is paid",
]
INSTRUCTED = {"query": "Instruct: Given a question, find the answer\nQuery: ", "document": ""}
"""Qwen3-Embedding's kind of prompts: an instruction before queries, documents as they are."""
TASKS = {"query": "task: search result | query: ", "document": "title: none | text: "}
"""EmbeddingGemma's kind."""
SAVED = {
    "qwen3": ("lasttoken", 0, INSTRUCTED),
    "qwen2": ("lasttoken", 0, INSTRUCTED),
    "mistral": ("lasttoken", 0, INSTRUCTED),
    "llama": ("mean", 0, INSTRUCTED),
    "gemma2": ("lasttoken", 1, TASKS),
    "gemma3_text": ("mean", 2, TASKS),
}
"""Each architecture as its embedders are saved: pooling, Dense modules, prompts."""


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("decoders")
    made = {}
    for kind, (pooling, dense, prompts) in SAVED.items():
        network = random_decoder(kind, root / kind / "network")
        made[kind] = decoder_folder(
            network, root / kind / "st", pooling=pooling, dense=dense, prompts=prompts
        )
    return made


@pytest.fixture(autouse=True)
def own_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("SEMSEARCH_CACHE", str(tmp_path_factory.getbasetemp() / "decoders-cache"))


def reference(folder: str) -> tuple[np.ndarray, np.ndarray]:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(folder, device="cpu", local_files_only=True)
    return (
        model.encode_query(TEXTS, normalize_embeddings=True),
        model.encode_document(TEXTS, normalize_embeddings=True),
    )


@pytest.mark.parametrize("backend", ["torch", pytest.param("onnx", marks=pytest.mark.slow)])
@pytest.mark.parametrize("kind", list(DECODERS))
def test_each_decoder_as_saved_equals_sentence_transformers(folders, kind, backend):
    """Each exports (``slow``: an export a model); the index test below runs one graph in the inner loop."""
    encoder = encoder_for(Strategy(model=folders[kind], backend=backend))
    assert encoder.decision.runtime == backend, encoder.decision.why
    pooling, dense, prompts = SAVED[kind]
    assert encoder.strategy.pooling == {"lasttoken": "last-token"}.get(pooling, pooling)
    assert len(encoder.strategy.modules) == dense
    assert (encoder.strategy.query_prefix, encoder.strategy.passage_prefix) == (
        prompts["query"],
        prompts["document"],
    )
    queries, documents = reference(folders[kind])
    np.testing.assert_allclose(encoder.embed(TEXTS, role="query"), queries, atol=1e-4)
    np.testing.assert_allclose(encoder.embed(TEXTS, role="passage"), documents, atol=1e-4)


def test_qwen_pads_on_the_left_appends_its_end_of_text_and_pools_it(folders):
    """sentence-transformers pads Qwen's batches on the left, as its tokenizer says; semsearch pads
    on the right and pools each text's own last token (its appended ``<|endoftext|>``): rotary
    positions make both the same vectors, alone or in a batch of other lengths."""
    from sentence_transformers import SentenceTransformer

    folder = folders["qwen3"]
    assert SentenceTransformer(folder, device="cpu")[0].tokenizer.padding_side == "left"
    encoder = encoder_for(Strategy(model=folder, backend="torch"))
    end = json.loads((Path(folder) / "tokenizer.json").read_text())["model"]["vocab"]["<|endoftext|>"]
    assert {ids[-1] for ids in encoder.tokens.ids(TEXTS)} == {end}
    alone = np.concatenate([encoder.embed([text]) for text in TEXTS])
    np.testing.assert_allclose(encoder.embed(TEXTS), alone, atol=1e-5)


def by_hand(folder: str, layer: int) -> np.ndarray:
    """The mean of hidden state ``layer`` over each text's tokens, from the whole transformers model."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.padding_side = "right"
    model = AutoModel.from_pretrained(folder).eval()
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.inference_mode():
        states = model(**batch, output_hidden_states=True).hidden_states[layer].numpy()
    mask = batch["attention_mask"].numpy()[..., None]
    vectors = (states * mask).sum(1) / mask.sum(1)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


@pytest.mark.parametrize("backend", ["torch", "onnx"])
@pytest.mark.parametrize("kind", ["qwen3", "gemma3_text"])
def test_layers_read_any_hidden_state(folders, kind, backend):
    for layer in (0, 1):
        strategy = Strategy(
            model=folders[kind], layers=(layer,), pooling="mean", backend=backend, passage_prefix=""
        )
        encoder = encoder_for(strategy)
        assert encoder.decision.runtime == backend and encoder.strategy.modules == ()
        np.testing.assert_allclose(
            encoder.embed(TEXTS, role="passage"), by_hand(folders[kind], layer), atol=1e-5, err_msg=f"{layer}"
        )


def test_a_tokenizer_class_that_rebuilds_its_file_runs_on_torch_and_says_why(folders, tmp_path):
    """transformers' LlamaTokenizer builds its pipeline itself (a Metaspace pre-tokenizer) rather
    than as this tokenizer.json says: the graph, tokenised from the file alone, would read other
    tokens, so it is not exported; torch embeds as sentence-transformers does."""
    folder = tmp_path / "rebuilt"
    shutil.copytree(folders["llama"], folder)
    decoder_tokenizer(folder, "mistral")  # as written, not as sentence-transformers saved it
    said = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**said, "tokenizer_class": "LlamaTokenizer"}))
    encoder = encoder_for(Strategy(model=str(folder)))
    assert encoder.decision.runtime == "torch"
    assert "tokenizer.json alone tokenises otherwise than transformers" in (
        encoder.decision.export_failure or ""
    )
    queries, documents = reference(str(folder))
    np.testing.assert_allclose(encoder.embed(TEXTS, role="query"), queries, atol=1e-4)
    np.testing.assert_allclose(encoder.embed(TEXTS, role="passage"), documents, atol=1e-4)


def test_an_index_of_a_decoder_answers_from_the_graph_it_holds(folders, tmp_path):
    from indexer import build_index
    from search.read.engine import SearchEngine
    from search.read.info import index_info

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    build_index(corpus, tmp_path / "index", Strategy(model=folders["gemma3_text"]))
    info = index_info(tmp_path / "index")
    assert info["encoder"] == "onnx", info
    assert info["model_says"].startswith(
        "pooling mean, dense 32->48 identity, dense 48->32 identity, normalize"
    )
    engine = SearchEngine(tmp_path / "index")
    np.testing.assert_allclose(engine.snapshot.embed(TEXTS), reference(folders["gemma3_text"])[0], atol=1e-4)
    assert sorted(hit.text for hit in engine.search(TEXTS[1], k=3)) == sorted(TEXTS)


SPOILED = {
    "gemma2 sliding_window 0": ("gemma2", {"sliding_window": 0}, "sliding_window 0"),
    "gemma2 sliding_window -4": ("gemma2", {"sliding_window": -4}, "sliding_window -4"),
    "gemma3 sliding_window 0": ("gemma3_text", {"sliding_window": 0}, "sliding_window 0"),
    "mistral sliding_window 0": ("mistral", {"sliding_window": 0}, "sliding_window 0"),
    "qwen3 sliding_window 0": (
        "qwen3",
        {"sliding_window": 0, "use_sliding_window": True},
        "sliding_window 0",
    ),
    "qwen3 num_key_value_heads 0": ("qwen3", {"num_key_value_heads": 0}, "num_key_value_heads 0"),
    "qwen2 num_attention_heads 0": ("qwen2", {"num_attention_heads": 0}, "num_attention_heads 0"),
    "qwen3 head_dim 0": ("qwen3", {"head_dim": 0}, "head_dim 0"),
    "mistral heads not shared evenly": ("mistral", {"num_key_value_heads": 3}, "num_key_value_heads 3"),
    "llama width not split in heads": (
        "llama",
        {"num_attention_heads": 5, "num_key_value_heads": None, "head_dim": None},
        "hidden_size 32",
    ),
    "gemma2 final_logit_softcapping 0": (
        "gemma2",
        {"final_logit_softcapping": 0},
        "final_logit_softcapping 0",
    ),
    "gemma2 attn_logit_softcapping -1": (
        "gemma2",
        {"attn_logit_softcapping": -1},
        "attn_logit_softcapping -1",
    ),
}
"""A decoder's config.json saying a size or setting transformers cannot run, or runs otherwise
than the exported graph: refused when the folder is read."""


@pytest.mark.parametrize("case", list(SPOILED))
def test_a_decoder_config_transformers_cannot_run_as_saved_is_refused_in_one_line(folders, case, tmp_path):
    from click.testing import CliRunner

    from search.cli import cli

    kind, change, said = SPOILED[case]
    folder = tmp_path / "model"
    shutil.copytree(folders[kind], folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **change}))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    result = CliRunner().invoke(
        cli, ["index", str(corpus), "-o", str(tmp_path / "index"), "--model", str(folder)]
    )
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1 and lines[0].startswith("Error: "), result.output
    assert "config.json" in lines[0] and said in lines[0] and "unexpected" not in lines[0], lines[0]
    assert not (tmp_path / "index").exists()
