"""Shards embedded apart and merged equal one build: the path for embedding on many machines."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from indexer import Strategy, build_index
from indexer.errors import BadInput, SemsearchError
from indexer.reading.corpus import Entry, read_corpus
from indexer.store import open_index
from indexer.writing.shards import embed_shard, merge_shards
from search import SearchEngine
from tests.helpers import DATA, ROOT, random_bert


def test_merged_shards_answer_like_a_single_build(tmp_path, tiny_model):
    corpus = read_corpus(DATA / "demo_faq.csv", text_fields=["question", "answer"])
    strategy = Strategy(model=tiny_model)
    shards = [embed_shard(corpus.entries[i::3], tmp_path / f"shard-{i}", strategy) for i in range(3)]
    assert merge_shards(shards, tmp_path / "merged") == len(corpus.entries)
    build_index(DATA / "demo_faq.csv", tmp_path / "single", strategy, text_fields=["question", "answer"])
    merged, single = SearchEngine(tmp_path / "merged"), SearchEngine(tmp_path / "single")
    for question in ("can I pay with apple pay", "lost my phone on a bike", "helmet rules"):
        a, b = merged.search(question, k=5), single.search(question, k=5)
        assert [h.id for h in a] == [h.id for h in b]
        np.testing.assert_allclose([h.score for h in a], [h.score for h in b], atol=1e-5)
    assert open_index(tmp_path / "merged").meta["count"] == len(corpus.entries)
    other = embed_shard(corpus.entries[:5], tmp_path / "other", Strategy(model=tiny_model, layers=(-1,)))
    with pytest.raises(SemsearchError, match="another strategy"):
        merge_shards([shards[0], other], tmp_path / "bad")
    with pytest.raises(SemsearchError, match="share entry ids"):
        merge_shards([shards[0], shards[0]], tmp_path / "bad")


def test_shards_of_one_model_at_two_paths_merge_with_their_fields_and_storage(tmp_path, tiny_model):
    """Two machines hold the same model at different paths; the workers say which fields made
    the text, and the merge keeps them (and takes a storage) like a build would."""
    corpus = read_corpus(DATA / "demo_faq.csv", text_fields=["question", "answer"])
    copy = shutil.copytree(tiny_model, tmp_path / "machine-b" / "model")
    fields = {"text_fields": ["question", "answer"], "id_field": "id"}
    a = embed_shard(corpus.entries[::2], tmp_path / "a", Strategy(model=tiny_model), **fields)
    b = embed_shard(corpus.entries[1::2], tmp_path / "b", Strategy(model=str(copy)), **fields)
    assert merge_shards([a, b], tmp_path / "merged", storage="float16") == len(corpus.entries)
    meta = open_index(tmp_path / "merged").meta
    assert meta["source"]["text_fields"] == ["question", "answer"] and meta["source"]["id_field"] == "id"
    assert meta["storage"] == "float16"
    other = embed_shard(
        corpus.entries[:3], tmp_path / "c", Strategy(model=tiny_model), text_fields=["question"]
    )
    with pytest.raises(SemsearchError, match="text fields"):
        merge_shards([a, other], tmp_path / "bad")


@pytest.mark.slow
def test_shard_files_are_utf8_whatever_the_locale(tmp_path, tiny_model):
    """Python warns where a file is opened in the locale's encoding; none of those may be a shard
    file (the opener reported is the last frame in our code)."""
    entries = [Entry("e1", "Café crème, naïve façade", {"text": "Café crème, naïve façade"})]
    shard = embed_shard(entries, tmp_path / "s", Strategy(model=tiny_model))
    script = """
import sys, traceback, warnings
from indexer.writing.shards import merge_shards
warnings.simplefilter("error", EncodingWarning)
try:
    merge_shards([sys.argv[1]], sys.argv[2])
except EncodingWarning as exc:
    ours = [f for f in traceback.extract_tb(exc.__traceback__) if "/indexer/" in f.filename]
    print(f"{ours[-1].filename}:{ours[-1].lineno}")
"""
    done = subprocess.run(
        [sys.executable, "-X", "warn_default_encoding", "-c", script, str(shard), str(tmp_path / "probe")],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 0 and "shards.py" not in done.stdout, done.stdout + done.stderr[-2000:]
    merge_shards([shard], tmp_path / "index")
    stored = open_index(tmp_path / "index").db.execute("select _text from entries").fetchone()[0]
    assert stored == "Café crème, naïve façade"


@pytest.fixture(scope="module")
def faq_shards(tmp_path_factory, tiny_model) -> list[Path]:
    """Two good shards of the demo FAQ (question + answer), embedded once for the module."""
    corpus = read_corpus(DATA / "demo_faq.csv", text_fields=["question", "answer"])
    root = tmp_path_factory.mktemp("shards")
    return [embed_shard(corpus.entries[i::2], root / f"s{i}", Strategy(model=tiny_model)) for i in range(2)]


def spoil(shard: Path, target: Path, how: str) -> Path:
    """A copy of ``shard`` made inconsistent in one way (as a broken worker might write it)."""
    bad = Path(shutil.copytree(shard, target))
    vectors, owners = np.load(bad / "vectors.npy"), np.load(bad / "owners.npy")
    if how == "owner -1":
        owners[3] = -1
    elif how == "owner past the end":
        owners[-1] = owners.max() + 1
    elif how == "fewer vectors than entries":
        keep = owners < owners.max() // 2
        vectors, owners = vectors[keep], owners[keep]
    elif how == "fewer owners than vectors":
        owners = owners[:-1]
    elif how == "NaN":
        vectors[5, 2] = np.nan
    elif how == "zero vector":
        vectors[5] = 0
    elif how == "integer vectors":
        vectors = (vectors * 100).astype(np.int64)
    elif how == "other dimension":
        vectors = vectors[:, :-1]
    elif how == "owners not integers":
        owners = owners.astype(np.float64)
    elif how in ("reserved field", "entry not an object"):
        lines = (bad / "entries.jsonl").read_text(encoding="utf-8").splitlines()
        record = json.loads(lines[0])
        record["fields"]["_rowid"] = 7
        lines[0] = json.dumps(record) if how == "reserved field" else json.dumps([1, 2])
        (bad / "entries.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    np.save(bad / "vectors.npy", vectors)
    np.save(bad / "owners.npy", owners)
    return bad


@pytest.mark.parametrize(
    "how",
    [
        "owner -1",
        "owner past the end",
        "fewer vectors than entries",
        "fewer owners than vectors",
        "NaN",
        "zero vector",
        "integer vectors",
        "other dimension",
        "owners not integers",
        "reserved field",
        "entry not an object",
    ],
)
def test_merge_refuses_an_inconsistent_shard_before_writing(faq_shards, tmp_path, how):
    """A shard that would make wrong answers (an entry answered by another's vector, entries
    without vectors, vectors that score NaN) is refused with one line naming it; nothing is
    written, and an existing index stays as it was."""
    from search.cli import cli

    bad = spoil(faq_shards[1], tmp_path / "bad", how)
    with pytest.raises(BadInput, match="shard:? .*bad"):
        merge_shards([faq_shards[0], bad], tmp_path / "new")
    assert not (tmp_path / "new").exists()
    merge_shards(faq_shards, tmp_path / "idx")
    before = sorted(p.name for p in (tmp_path / "idx").iterdir())
    result = CliRunner().invoke(cli, ["merge", str(faq_shards[0]), str(bad), "-o", str(tmp_path / "idx")])
    assert result.exit_code == 1 and "unexpected" not in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1 and str(bad) in result.output
    assert sorted(p.name for p in (tmp_path / "idx").iterdir()) == before


def test_a_model_replaced_at_its_path_since_the_shards_is_refused(tmp_path):
    """The shards record the model's fingerprint; merge builds the index's query graph from the
    model at that path now. Another model there is refused, naming both, and nothing is written."""
    model = tmp_path / "model"
    random_bert(model, seed=0)
    entries = [Entry(f"e{i}", f"entry {i} about bikes", {"text": f"entry {i} about bikes"}) for i in range(4)]
    shards = [embed_shard(entries[i::2], tmp_path / f"s{i}", Strategy(model=str(model))) for i in range(2)]
    recorded = json.loads((shards[0] / "strategy.json").read_text())["model_fingerprint"]
    shutil.rmtree(model)
    random_bert(model, seed=1)
    with pytest.raises(SemsearchError) as caught:
        merge_shards(shards, tmp_path / "merged")
    message = str(caught.value)
    assert "\n" not in message and recorded[:19] in message and str(model) in message
    assert str(shards[0]) in message
    assert not (tmp_path / "merged").exists()
