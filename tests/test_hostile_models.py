"""A model folder is data a stranger may have written. Each hostile folder below, built from a tiny
random model, is refused by `semsearch index` in one ``Error:`` line naming the bad file and why,
before anything is written: the index already there survives, a fresh output is never made, no
code of the folder runs, nothing is read past its files, nothing hangs, and no line advises
loading the file unsafely. The torch-free reader of a Dense module's torch file reads what torch
reads, and refuses a tensor its storage does not hold."""

from __future__ import annotations

import collections
import io
import json
import os
import pickle
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from indexer.errors import BadInput
from search.cli import cli
from tests.helpers import (
    ROWS,
    build_faq,
    random_bert,
    random_encoder,
    sentence_transformers_folder,
    write_csv,
)

MARKER = Path("/tmp/semsearch-hostile-model-ran")
"""What the pickled code of the hostile torch files would make, had it run."""


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny transformers folder and a sentence-transformers one over it in the format before
    version 5 (its Dense weights a torch pickle, ``2_Dense/pytorch_model.bin``)."""
    root = tmp_path_factory.mktemp("hostile")
    network = random_bert(root / "network")
    folder = sentence_transformers_folder(network, root / "st", dense=True, legacy=True)
    return {"network": Path(network), "st": Path(folder)}


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory, tiny_model: str) -> Path:
    return build_faq(tmp_path_factory.mktemp("previous"), tiny_model)


@pytest.fixture(autouse=True)
def own_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("SEMSEARCH_CACHE", str(tmp_path_factory.getbasetemp() / "hostile-cache"))


class Run:
    """Code a pickle names: ``os.system`` on unpickling."""

    def __reduce__(self):
        return os.system, (f"touch {MARKER}",)


def torch_file(path: Path, tensors: dict[str, tuple], values: int = 4, compress: bool = False) -> None:
    """A zip laid out as ``torch.save`` writes it, whose pickle names each tensor as
    ``(shape, stride, offset)`` over one float32 storage of ``values`` zeros."""
    import torch

    storage = object()

    class Tensor:
        def __init__(self, shape: tuple, stride: tuple, offset: int):
            self.args = (storage, offset, shape, stride, False, collections.OrderedDict())

        def __reduce__(self):
            return torch._utils._rebuild_tensor_v2, self.args

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj: object) -> tuple | None:
            return ("storage", torch.FloatStorage, "0", "cpu", values) if obj is storage else None

    pickled = io.BytesIO()
    Pickler(pickled, protocol=2).dump({name: Tensor(*spec) for name, spec in tensors.items()})
    method = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    with zipfile.ZipFile(path, "w", compression=method) as archive:
        archive.writestr("archive/data.pkl", pickled.getvalue())
        archive.writestr("archive/data/0", np.zeros(values, np.float32).tobytes())
        archive.writestr("archive/version", "3\n")
        archive.writestr("archive/byteorder", "little")


def change_config(folder: Path, **change: object) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **change}))


def move_pooling(folder: Path, where: str) -> None:
    """The Pooling module's folder named ``where`` in modules.json (a max pooling put there)."""
    modules = json.loads((folder / "modules.json").read_text())
    modules[1]["path"] = where
    (folder / "modules.json").write_text(json.dumps(modules))
    outside = (folder / where).resolve()
    outside.mkdir(parents=True, exist_ok=True)
    (outside / "config.json").write_text(json.dumps({"pooling_mode": "max"}))


def save(content: object, path: Path, zipped: bool = True) -> None:
    """``torch.save``; not ``zipped``: in the format before torch 1.6, a bare pickle stream."""
    import torch

    torch.save(content, path, _use_new_zipfile_serialization=zipped)


def pickled_weights(folder: Path, content: object, zipped: bool = True) -> None:
    """The network's weights as a torch pickle of ``content`` instead of safetensors."""
    (folder / "model.safetensors").unlink()
    save(content, folder / "pytorch_model.bin", zipped)


def text_weights(folder: Path) -> None:
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_text("root:x:0:0:root:/root:/bin/bash\n")


def dense_of_other_shape(folder: Path) -> None:
    import torch

    save({"linear.weight": torch.zeros(24, 31), "linear.bias": torch.zeros(24)}, folder / DENSE)


def relink(path: Path, target: Path | str, instead: Path | None = None) -> None:
    """``path`` a symbolic link to ``target``, in place of itself or of the file ``instead``."""
    (instead or path).unlink()
    path.symlink_to(target)


def loop(folder: Path) -> None:
    shutil.rmtree(folder)
    folder.symlink_to(folder)


def listed(folder: Path, change: Callable[[list], object]) -> None:
    """``modules.json`` as ``change`` returns it from the list the folder holds."""
    modules = json.loads((folder / "modules.json").read_text())
    (folder / "modules.json").write_text(json.dumps(change(modules)))


def pooling_elsewhere(folder: Path, target: Path | None = None) -> None:
    """The Pooling module's folder a link to ``target``: a max pooling in a folder beside the
    model, or /etc when none is given."""
    if target is None:
        target = folder.parent / "other-model" / "1_Pooling"
        target.mkdir(parents=True)
        (target / "config.json").write_text(json.dumps({"pooling_mode": "max"}))
    shutil.rmtree(folder / "1_Pooling")
    (folder / "1_Pooling").symlink_to(target)


DENSE = Path("2_Dense") / "pytorch_model.bin"
CASES: dict[str, tuple[str, Callable[[Path], object], tuple[str, ...]]] = {
    "dense tensor beyond its storage": (
        "st",
        lambda f: torch_file(f / DENSE, {"linear.weight": ((24, 32), (32, 1), 0)}),
        (str(DENSE), "beyond its storage of 4 values"),
    ),
    "dense pickle with code": ("st", lambda f: save({"x": Run()}, f / DENSE), (str(DENSE), "posix.system")),
    "dense weights linked to /etc/passwd": (
        "st",
        lambda f: relink(f / DENSE.with_name("model.safetensors"), "/etc/passwd", f / DENSE),
        ("2_Dense/model.safetensors is not a safetensors file",),
    ),
    "dense activation named from elsewhere in torch": (
        "st",
        lambda f: change_config(f / "2_Dense", activation_function="torch.os.system.Tanh"),
        ("2_Dense", "Dense module semsearch cannot reproduce"),
    ),
    "dense weights not as config says": ("st", dense_of_other_shape, (str(DENSE), "24x31", "24x32")),
    "one layer more": ("network", lambda f: change_config(f, num_hidden_layers=4), ("num_hidden_layers 4",)),
    "a million layers": (
        "network",
        lambda f: change_config(f, num_hidden_layers=1_000_000),
        ("config.json says num_hidden_layers 1000000", "model.safetensors holds 3"),
    ),
    "layers not a number": (
        "network",
        lambda f: change_config(f, num_hidden_layers="many"),
        ("config.json", "num_hidden_layers 'many'"),
    ),
    "a million wide": (
        "network",
        lambda f: change_config(f, hidden_size=1_000_000),
        ("config.json says hidden_size 1000000", "model.safetensors"),
    ),
    "many positions": (
        "network",
        lambda f: change_config(f, max_position_embeddings=100_000),
        ("config.json says max_position_embeddings 100000", "model.safetensors holds 128"),
    ),
    "a setting of a type transformers refuses": (
        "network",
        lambda f: change_config(f, layer_norm_eps="tiny"),
        ("config.json", "layer_norm_eps", "'tiny'"),
    ),
    "a size the weights do not fit": (
        "network",
        lambda f: change_config(f, intermediate_size=100),
        ("model.safetensors", "do not fit the network its config.json describes"),
    ),
    "pooling outside the folder": (
        "st",
        lambda f: move_pooling(f, "../outside_pool"),
        ("modules.json", "../outside_pool"),
    ),
    "pooling at an absolute path": (
        "st",
        lambda f: move_pooling(f, str(f.parent / "pool")),
        ("modules.json", "outside"),
    ),
    "tokenizer nested deep": (
        "network",
        lambda f: (f / "tokenizer.json").write_text("[" * 200_000 + "]" * 200_000),
        ("tokenizer.json", "nested too deep"),
    ),
    "config nested deep": (
        "network",
        lambda f: (f / "config.json").write_text('{"a":' * 100_000 + "1" + "}" * 100_000),
        ("config.json", "nested too deep"),
    ),
    "weights linked to /etc/passwd": (
        "network",
        lambda f: relink(f / "model.safetensors", "/etc/passwd"),
        ("model.safetensors", "not a safetensors file"),
    ),
    "weights pickle with code": (
        "network",
        lambda f: pickled_weights(f, {"x": Run()}),
        ("pytorch_model.bin", "posix.system"),
    ),
    "weights pickle of torch before 1.6 with code": (
        "network",
        lambda f: pickled_weights(f, {"x": Run()}, zipped=False),
        ("pytorch_model.bin holds more than tensors",),
    ),
    "weights neither safetensors nor torch": (
        "network",
        text_weights,
        ("pytorch_model.bin is not a file torch.save writes",),
    ),
    "config a link loop": (
        "network",
        lambda f: relink(f / "config.json", f / "config.json"),
        ("config.json", "symbolic link that leads nowhere"),
    ),
    "folder a link loop": ("network", loop, ("model", "symbolic link that leads nowhere")),
    "modules.json an empty list": (
        "st",
        lambda f: listed(f, lambda m: []),
        ("modules.json", "lists no modules"),
    ),
    "modules.json an object": (
        "st",
        lambda f: listed(f, lambda m: {"a": 1}),
        ("modules.json", "no list of modules"),
    ),
    "two networks": ("st", lambda f: listed(f, lambda m: [m[0], m[0], *m[1:]]), ("Transformer", "second")),
    "no network first": ("st", lambda f: listed(f, lambda m: m[1:]), ("Pooling", "cannot reproduce")),
    "no pooling": ("st", lambda f: listed(f, lambda m: m[:1]), ("modules.json", "no Pooling")),
    "pooling folder linked to /etc": (
        "st",
        lambda f: pooling_elsewhere(f, Path("/etc")),
        ("1_Pooling", "outside the model folder"),
    ),
    "pooling folder linked to another model's": (
        "st",
        pooling_elsewhere,
        ("1_Pooling", "outside the model folder"),
    ),
}


def files_of(index: Path) -> dict[str, tuple[int, int]]:
    """The index's files as they are (its lock file apart: each writer takes it)."""
    found = [p for p in index.rglob("*") if p.name != ".lock"]
    return {str(p.relative_to(index)): (p.stat().st_size, p.stat().st_mtime_ns) for p in found}


@pytest.mark.parametrize("case", list(CASES))
def test_a_hostile_folder_is_refused_in_one_line_and_nothing_is_written(case, saved, previous, tmp_path):
    base, spoil, said = CASES[case]
    folder = tmp_path / "model"
    shutil.copytree(saved[base], folder, symlinks=True)
    spoil(folder)
    corpus = write_csv(tmp_path / "faq.csv", ROWS)
    before = files_of(previous)
    MARKER.unlink(missing_ok=True)
    for target in (previous, tmp_path / "fresh"):
        result = CliRunner().invoke(cli, ["index", str(corpus), "-o", str(target), "--model", str(folder)])
        lines = result.output.strip().splitlines()
        assert result.exit_code == 1 and len(lines) == 1 and lines[0].startswith("Error: "), result.output
        assert all(part in lines[0] for part in said), lines[0]
        assert "unexpected" not in lines[0] and "weights_only" not in lines[0], lines[0]
    assert files_of(previous) == before and not (tmp_path / "fresh").exists()
    assert not MARKER.exists()


READER_CASES = {
    "past its end": ({"w": ((24, 32), (32, 1), 0)}, "a 24x32 tensor beyond its storage of 4 values"),
    "from past its end": ({"w": ((1,), (1,), 4)}, "beyond its storage"),
    "by its strides": ({"w": ((2, 2), (3, 1), 0)}, "beyond its storage"),
    "more values than it holds": ({"w": ((1000, 1000), (0, 0), 0)}, "more values than its storage"),
    "a negative stride": ({"w": ((2,), (-1,), 3)}, "stride"),
    "a negative offset": ({"w": ((2,), (1,), -1)}, "offset"),
    "strides not its shape": ({"w": ((2, 2), (1,), 0)}, "stride"),
    "a shape of no numbers": ({"w": (("2",), (1,), 0)}, "shape"),
}


@pytest.mark.parametrize("case", list(READER_CASES))
def test_the_torch_reader_refuses_a_tensor_its_storage_does_not_hold(case, tmp_path):
    from indexer.embedding.weights import read_tensors, tensor_shapes

    tensors, said = READER_CASES[case]
    path = tmp_path / "pytorch_model.bin"
    torch_file(path, tensors)
    for read in (tensor_shapes, read_tensors):
        with pytest.raises(BadInput) as refused:
            read(path)
        assert str(path) in str(refused.value) and said in str(refused.value)
        assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    "spoil, said",
    [
        (lambda p: p.write_bytes(b"not a zip"), "not a file torch.save writes"),
        (lambda p: torch_file(p, {"w": ((2,), (1,), 0)}, compress=True), "compressed"),
        (lambda p: p.symlink_to("/etc/passwd"), "not a file torch.save writes"),
    ],
)
def test_the_torch_reader_refuses_what_torch_save_does_not_write(spoil, said, tmp_path):
    from indexer.embedding.weights import read_tensors

    path = tmp_path / "pytorch_model.bin"
    spoil(path)
    with pytest.raises(BadInput, match=said) as refused:
        read_tensors(path)
    assert str(path) in str(refused.value) and "\n" not in str(refused.value)


def test_the_torch_reader_reads_what_torch_saved(tmp_path):
    """Views into one storage (a transpose, a slice from an offset) and each dtype torch writes."""
    import torch

    from indexer.embedding.weights import read_tensors, tensor_shapes

    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    tensors = {
        "base": base,
        "transposed": base.t(),
        "slice": base[1:3, 2:5],
        "half": base.half(),
        "bfloat16": base.bfloat16(),
        "double": base.double()[2:],
        "long": torch.arange(5),
        "empty": torch.zeros(0, 3),
    }
    torch.save(tensors, tmp_path / "w.bin")
    read = read_tensors(tmp_path / "w.bin")
    assert tensor_shapes(tmp_path / "w.bin") == {k: tuple(v.shape) for k, v in tensors.items()}
    for name, tensor in tensors.items():
        assert read[name].dtype == np.float32
        np.testing.assert_array_equal(read[name], tensor.float().numpy(), err_msg=name)


@pytest.mark.parametrize("kind", ["bert", "distilbert", "albert", "modernbert"])
def test_the_size_check_passes_each_kind_of_model_as_saved(kind, tmp_path):
    """DistilBERT names its sizes otherwise, ALBERT shares one block, ModernBERT has no
    position table: each passes as transformers saved it, and is refused where config.json
    says a million blocks."""
    from indexer.embedding.models import check_model

    folder = Path(random_encoder(kind, tmp_path / kind))
    assert check_model(str(folder), str(folder))["model_type"] == kind
    change_config(folder, **{"n_layers" if kind == "distilbert" else "num_hidden_layers": 1_000_000})
    with pytest.raises(BadInput, match="1000000"):
        check_model(str(folder), str(folder))


@pytest.mark.parametrize("zipped", [True, False])
def test_weights_torch_saved_load_as_before(zipped, saved, tmp_path):
    """A network's weights as a torch file, in either format torch writes, pass the checks and
    load (the format before torch 1.6 by torch alone, with ``weights_only``)."""
    from safetensors.torch import load_file

    from indexer.embedding.models import check_model, load_model

    folder = tmp_path / "model"
    shutil.copytree(saved["network"], folder)
    pickled_weights(folder, load_file(folder / "model.safetensors"), zipped)
    assert check_model(str(folder), str(folder))["num_hidden_layers"] == 3
    assert load_model(str(folder))[1].config.num_hidden_layers == 3


def test_the_bundled_model_passes_the_checks():
    from indexer.embedding.models import check_model, model_location
    from indexer.embedding.strategy import DEFAULT_MODEL

    assert check_model(DEFAULT_MODEL, model_location(DEFAULT_MODEL))["hidden_size"] == 384
