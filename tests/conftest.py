"""Shared fixtures and hooks: the tiny random BERT and the real bundled model, built once for
the session, indexes built once and handed out as copies, and the watch that fails a test not
marked slow which does slow work. Helpers that test modules import live in ``tests/helpers.py``."""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"  # no test reaches the Hub (tests/test_hub.py serves a stand-in)

from tests.helpers import random_bert, torch_reference  # noqa: E402 (after the line above)

_SLOW_WORK: list[str] | None = None
"""What the running test, one not marked slow, did that only a slow test may do (None: no test
is being watched)."""


def _noting(what: str, function: Callable, applies: Callable[..., bool] = lambda *a, **k: True) -> Callable:
    """``function``, noting ``what`` for the watched test each time a call ``applies``; in the
    test's own thread it fails the test there and then (before the slow work)."""

    @functools.wraps(function)
    def noted(*args, **kwargs):
        global _SLOW_WORK
        if _SLOW_WORK is not None and applies(*args, **kwargs):
            if threading.current_thread() is threading.main_thread():
                _SLOW_WORK = None  # failed here: not again at teardown
                pytest.fail(f"{what}: mark it @pytest.mark.slow", pytrace=False)
            _SLOW_WORK.append(what)
        return function(*args, **kwargs)

    return noted


def pytest_configure(config: pytest.Config) -> None:
    """Watch for what makes a test slow (a subprocess, the real model on torch or ONNX Runtime),
    before any test module imports the code that does it."""
    from indexer.embedding import models
    from indexer.embedding.strategy import DEFAULT_MODEL
    from indexer.encoders import onnx_graph

    real = models.model_location(DEFAULT_MODEL)
    models.load_model = _noting(
        "loads the real model", models.load_model, lambda model, **_: models.model_location(model) == real
    )
    real_config = (Path(real) / "config.json").read_bytes()

    def real_graph(spec: onnx_graph.GraphSpec) -> bool:
        """The bundled model's graph, from the cache or held by an index (its config beside it)."""
        held = Path(spec.location) / "config.json"
        return spec.location == real or (spec.home is not None and held.read_bytes() == real_config)

    onnx_graph.OnnxGraph.__init__ = _noting(
        "runs the real model's ONNX graph",
        onnx_graph.OnnxGraph.__init__,
        lambda _, spec, **__: real_graph(spec),
    )
    subprocess.Popen.__init__ = _noting("starts a subprocess", subprocess.Popen.__init__)


_TORCH_THREADS: int | None = None
"""torch's own intra-op thread count, given back to slow tests (None: not read yet)."""


def _torch_threads(slow: bool) -> None:
    """Tests not marked slow run torch on one thread: the tiny BERT's matrices gain nothing from a
    second, and on a busy machine waiting for it made a tiny training 6x slower (3 s against 18 to
    22 s, interleaved). Slow tests, the real model's, get torch's own count back."""
    global _TORCH_THREADS
    if slow and "torch" not in sys.modules:
        return
    import torch

    if _TORCH_THREADS is None:
        _TORCH_THREADS = torch.get_num_threads()
    torch.set_num_threads(_TORCH_THREADS if slow else 1)


_MADE: dict[str, bytes] = {}
"""Graphs torch traced and ONNX Runtime fused this session, by what they were made from."""
KEPT_GRAPH_BYTES = 32 << 20
"""The largest graph kept (the tiny models' are about 4 MB; the real model's are not kept)."""


def _digest(*parts: object) -> str:
    """sha256 over ``parts``: bytes as they are, anything else by its ``repr``."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part if isinstance(part, bytes) else repr(part).encode())
        digest.update(b"\0")
    return digest.hexdigest()


def _made_once(
    make: Callable, key: Callable[..., str | None], made_bytes: Callable, again: Callable
) -> Callable:
    """``make``, a pure function of its inputs that makes a file, run once a session for each
    ``key`` of its inputs (None: run each time): ``made_bytes(made, *args)`` reads what the first
    call made, ``again(kept, *args)`` makes it again from those bytes."""

    @functools.wraps(make)
    def once(*args, **kwargs):
        found = key(*args, **kwargs)
        if found is not None and found in _MADE:
            return again(_MADE[found], *args, **kwargs)
        made = make(*args, **kwargs)
        if found is not None:
            kept = made_bytes(made, *args, **kwargs)
            if len(kept) <= KEPT_GRAPH_BYTES:
                _MADE[found] = kept
        return made

    return once


class _Fused:
    """A fused graph made again: ``optimize_model``'s result as its caller uses it."""

    def __init__(self, kept: bytes):
        self.kept = kept

    def save_model_to_file(self, path: str, *args: object, **kwargs: object) -> None:
        Path(path).write_bytes(self.kept)


def _fused_bytes(made: Any, *args: object, **kwargs: object) -> bytes:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        made.save_model_to_file(str(Path(folder) / "fused.onnx"))
        return (Path(folder) / "fused.onnx").read_bytes()


def _traced_key(module: Any, sample: tuple, path: object, **options: object) -> str | None:
    """A traced graph's inputs: the module's class, structure, settings and weights, its
    network's config, the sample and the export's options (a file path only; not dynamo)."""
    if not isinstance(path, str) or options.get("dynamo", True):
        return None
    weights = [(name, t.detach().cpu().numpy().tobytes()) for name, t in module.state_dict().items()]
    said = {k: repr(v) for k, v in vars(module).items() if not k.startswith("_")}
    config = getattr(getattr(module, "network", None), "config", None)
    settings = config.to_json_string() if config is not None else None
    shapes = [t.tolist() for t in sample]
    return _digest("trace", type(module).__qualname__, repr(module), said, settings, shapes, weights, options)


def _fused_key(path: str, **options: Any) -> str:
    """A fused graph's inputs: the traced file's bytes and the fusion's options."""
    fusions = options.get("optimization_options")
    chosen = sorted(vars(fusions).items()) if fusions is not None else None
    rest = sorted((k, v) for k, v in options.items() if k != "optimization_options")
    return _digest("fuse", Path(path).read_bytes(), rest, chosen)


def _keep_exports() -> None:
    """ONNX exports of the same network are traced and fused once a session: each costs about a
    second, and tests export the tiny models' graphs again into caches of their own. Both steps
    are pure functions of what the keys name (two exports of one graph write the same bytes:
    ``indexer.encoders.onnx_export``); all around them (the cache, its notes, the int8 rewrite,
    the weights written apart, their sums) runs each time."""
    torch = sys.modules.get("torch")
    if torch is not None and not hasattr(torch.onnx.export, "__wrapped__"):
        torch.onnx.export = _made_once(
            torch.onnx.export,
            _traced_key,
            lambda made, module, sample, path, **_: Path(path).read_bytes(),
            lambda kept, module, sample, path, **_: Path(path).write_bytes(kept) and None,
        )
    fusing = sys.modules.get("onnxruntime.transformers.optimizer")
    if fusing is not None and not hasattr(fusing.optimize_model, "__wrapped__"):
        fusing.optimize_model = _made_once(
            fusing.optimize_model, _fused_key, _fused_bytes, lambda kept, *_, **__: _Fused(kept)
        )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Watch a test not marked slow from the start of its setup, its module's fixtures included."""
    global _SLOW_WORK
    slow = item.get_closest_marker("slow") is not None
    _torch_threads(slow)
    _keep_exports()
    _SLOW_WORK = None if slow else []


@pytest.fixture(autouse=True)
def _slow_work_is_marked(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test not marked slow that starts a subprocess or runs the real model fails, so
    ``pytest -m "not slow"`` stays a quick inner loop."""
    global _SLOW_WORK
    if request.node.get_closest_marker("slow"):
        yield
        return
    if "bundled" in request.fixturenames:
        pytest.fail("uses the real model (the bundled fixture): mark it @pytest.mark.slow", pytrace=False)
    try:
        yield
    finally:
        done, _SLOW_WORK = _SLOW_WORK, None
    if done:
        pytest.fail(f"{', '.join(dict.fromkeys(done))}: mark it @pytest.mark.slow", pytrace=False)


@pytest.fixture(scope="session")
def plotting() -> None:
    """matplotlib with its font cache built, when it is installed. The first import on a machine
    lists the fonts in a subprocess (``fc-list``) and caches them: setup, once, not a test's slow
    work, so it is not watched."""
    global _SLOW_WORK
    watched, _SLOW_WORK = _SLOW_WORK, None
    try:
        import matplotlib.font_manager  # noqa: F401  (builds the cache on its first import)
    except ImportError:
        pass
    finally:
        _SLOW_WORK = watched


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny random BERT of ``random_bert``, built once for the session."""
    return random_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="session")
def built_once(
    tmp_path_factory: pytest.TempPathFactory,
) -> Callable[[str, Callable[[Path], Path], Path], Path]:
    """``copy(key, build, target)``: the index ``build(folder)`` makes, built once for the session
    under ``key`` and copied to ``target`` for each test, so a test may change its copy as it
    likes. Many modules build the same tiny index before every test; a copy costs a hundredth of
    a build. The key must name everything ``build`` depends on."""
    built: dict[str, Path] = {}

    def copy(key: str, build: Callable[[Path], Path], target: Path) -> Path:
        if key not in built:
            built[key] = build(tmp_path_factory.mktemp("built"))
        shutil.copytree(built[key], target, symlinks=True)
        return target

    return copy


@pytest.fixture(scope="session")
def bundled():
    """The real default model on torch, the reference every other backend is held to; loaded
    once for the session."""
    from indexer.embedding.strategy import Strategy

    return torch_reference(Strategy(backend="torch"))


@pytest.fixture
def reachable_tmp() -> Iterator[Path]:
    """A temporary folder every user can reach (``tmp_path`` is private to its owner): for a
    test that reads an index as another user (``helpers.unwritable``)."""
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="semsearch-test-"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
