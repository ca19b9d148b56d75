"""A model's fingerprint is asked for dozens of times a build: its folder is listed once a
process, and listed again the moment anything that decides the list changes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from indexer.embedding.fingerprints import file_hashes, model_fingerprint


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SEMSEARCH_CACHE", str(tmp_path / "cache"))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"weights")
    return model


def test_a_model_folder_is_listed_once_while_nothing_changes(folder, monkeypatch):
    first = model_fingerprint(folder)
    listed: list[Path] = []
    glob = Path.glob
    monkeypatch.setattr(Path, "glob", lambda self, pattern: listed.append(self) or glob(self, pattern))
    assert [model_fingerprint(folder) for _ in range(30)] == [first] * 30
    assert listed == []


def test_a_file_added_removed_or_rewritten_changes_the_fingerprint_at_once(folder):
    seen = {model_fingerprint(folder)}
    (folder / "vocab.txt").write_text("[PAD]\n")
    seen.add(model_fingerprint(folder))
    (folder / "model.safetensors").write_bytes(b"other weights")
    seen.add(model_fingerprint(folder))
    (folder / "vocab.txt").unlink()
    seen.add(model_fingerprint(folder))
    assert len(seen) == 4
    assert set(file_hashes(folder)) == {"config.json", "model.safetensors"}


def test_modules_json_rewritten_in_place_is_read_again(folder):
    """modules.json names the folders whose files count: rewritten (same folder times), the
    fingerprint follows it."""
    for name in ("2_Dense", "3_Dense"):
        (folder / name).mkdir()
        (folder / name / "config.json").write_text(json.dumps({"in_features": 4, "out_features": 4}))
        (folder / name / "model.safetensors").write_bytes(name.encode())
    listing = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}]

    def dense(path: str) -> list[dict[str, object]]:
        return [*listing, {"idx": 1, "name": "1", "path": path, "type": "sentence_transformers.models.Dense"}]

    (folder / "modules.json").write_text(json.dumps(dense("2_Dense")))
    assert "2_Dense/model.safetensors" in file_hashes(folder)
    with (folder / "modules.json").open("w") as f:  # the same file, rewritten
        f.write(json.dumps(dense("3_Dense")))
    hashes = file_hashes(folder)
    assert "3_Dense/model.safetensors" in hashes and "2_Dense/model.safetensors" not in hashes
