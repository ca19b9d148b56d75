"""Shared fixtures and hooks: the tiny random BERT and the real bundled model, built once for
the session, indexes built once and handed out as copies, and the watch that fails a test not
marked slow which does slow work. Helpers that test modules import live in ``tests/helpers.py``."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

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


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Watch a test not marked slow from the start of its setup, its module's fixtures included."""
    global _SLOW_WORK
    slow = item.get_closest_marker("slow") is not None
    _torch_threads(slow)
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
