"""What a command writes for the user (``encode``'s vectors, ``export-encoder``'s directory, ``tune``'s
model): made whole beside its place, never left half-written by a stopped run (SIGTERM cleans up,
the next run removes what a SIGKILL left), its missing folders made (and removed when it fails), one
clear line when its place cannot take it, and the modes a plain ``open()`` would give (the umask; a
replaced file keeps its mode; a symlink is written through)."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from indexer.errors import BadInput, DiskFull, IndexLocked
from search.read.encoding import Encoding, encode_file
from tests.helpers import assert_clean_failure, build_faq, run

TEXTS = ["How do I pay for a ride?", "a bike", "Where can I park the bike near the station?"]


def hidden(directory: Path, name: str) -> list[str]:
    """What a run left beside ``name``: its staging files or directories."""
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(f".{name}."))


def semsearch(*args: object) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "search.cli", *map(str, args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def wait_for(done: Callable[[], bool], process: subprocess.Popen, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        assert process.poll() is None, process.stderr.read().decode()
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@pytest.fixture
def texts(tmp_path) -> str:
    source = tmp_path / "texts.txt"
    source.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    return str(source)


@pytest.fixture(scope="module")
def encoding(tiny_model) -> Encoding:
    from indexer.embedding.strategy import Strategy

    return Encoding.load(Strategy(model=tiny_model))


@pytest.mark.slow
def test_a_terminated_encode_removes_its_partial_file(tmp_path, tiny_model):
    out = tmp_path / "out.npy"
    process = semsearch("encode", "--model", tiny_model, "-o", out)
    process.stdin.write(b"a first text\n")
    process.stdin.flush()
    wait_for(lambda: bool(hidden(tmp_path, "out.npy")), process)  # writing: waits for more input
    process.send_signal(signal.SIGTERM)
    assert process.wait(60) != 0
    assert "Traceback" not in process.stderr.read().decode()
    assert hidden(tmp_path, "out.npy") == [] and not out.exists()


@pytest.mark.slow
def test_the_next_encode_removes_what_a_killed_one_left(tmp_path, tiny_model):
    out = tmp_path / "out.npy"
    process = semsearch("encode", "--model", tiny_model, "-o", out)
    wait_for(lambda: bool(hidden(tmp_path, "out.npy")), process)
    process.kill()
    process.wait(60)
    assert hidden(tmp_path, "out.npy")  # a SIGKILL runs no clean-up
    done = run("encode", "--model", tiny_model, "-o", out, stdin="one\ntwo\n")
    assert done.returncode == 0, done.stderr
    assert hidden(tmp_path, "out.npy") == [] and np.load(out).shape[0] == 2


@pytest.mark.slow
def test_a_killed_export_s_staging_is_removed_by_the_next_export(tmp_path, tiny_model):
    """A run killed while it writes an export leaves its staging directory; the next export
    there removes it. A SIGTERM ends the same run through its clean-up."""
    from indexer.writing.export import export_encoder

    target = tmp_path / "onnx"
    for how in ("SIGKILL", "SIGTERM"):
        dying = subprocess.run(
            [
                sys.executable,
                "-c",
                "import os, signal, sys\n"
                "from indexer.files import staged_dir, stop_on_sigterm\n"
                "stop_on_sigterm()\n"
                "with staged_dir(sys.argv[1]) as made:\n"
                "    (made / 'model.onnx.data').write_bytes(b'x' * 1000)\n"
                f"    os.kill(os.getpid(), signal.{how})\n",
                target,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert dying.returncode == -signal.SIGKILL if how == "SIGKILL" else dying.returncode != 0
        assert "Traceback" not in dying.stderr
        left = hidden(tmp_path, "onnx")
        assert bool(left) == (how == "SIGKILL"), left
    export_encoder(build_faq(tmp_path, tiny_model), target)
    assert hidden(tmp_path, "onnx") == [] and (target / "model.onnx").is_file()


def refusing(monkeypatch, where: Path, code: int) -> None:
    """``os.open`` and ``os.mkdir`` fail with ``code`` inside ``where``, as on a read-only or
    full file system (root writes through permission bits, so they cannot show it)."""
    real_open, real_mkdir = os.open, os.mkdir

    def check(path: object) -> None:
        if str(where) in os.fspath(path):  # type: ignore[arg-type]
            raise OSError(code, os.strerror(code), os.fspath(path))  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", lambda path, *a, **k: check(path) or real_open(path, *a, **k))
    monkeypatch.setattr(os, "mkdir", lambda path, *a, **k: check(path) or real_mkdir(path, *a, **k))


def test_an_output_folder_that_is_read_only_is_one_line(tmp_path, texts, encoding, monkeypatch):
    """Read-only: the output's folder, or the one its missing folders would be made in."""
    readonly = tmp_path / "ro"
    readonly.mkdir()
    refusing(monkeypatch, readonly, errno.EROFS)
    for output in (readonly / "out.npy", readonly / "missing" / "out.npy"):
        with pytest.raises(BadInput, match="Read-only file system") as refused:
            encode_file(texts, output, encoding)
        assert ".out.npy" not in str(refused.value) and str(readonly) in str(refused.value)
    assert list(readonly.iterdir()) == []


def test_a_full_disk_during_encode_is_disk_full_and_leaves_nothing(tmp_path, texts, encoding, monkeypatch):
    from search.read import encoding as module

    def full(*args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(module._NpyWriter, "write", full)
    with pytest.raises(DiskFull, match="disk full"):
        encode_file(texts, tmp_path / "out.npy", encoding)
    assert hidden(tmp_path, "out.npy") == [] and not (tmp_path / "out.npy").exists()


def test_a_full_disk_during_export_is_disk_full_and_leaves_nothing(tmp_path, tiny_model, monkeypatch):
    from indexer.encoders import standalone
    from indexer.writing.export import export_encoder

    def full(*args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(standalone, "save", full)
    index = build_faq(tmp_path, tiny_model)
    with pytest.raises(DiskFull, match="disk full"):
        export_encoder(index, tmp_path / "onnx")
    assert hidden(tmp_path, "onnx") == [] and not (tmp_path / "onnx").exists()


@pytest.mark.slow
def test_closed_stdout_or_stdin_is_one_line(tmp_path, tiny_model):
    def closed(redirect: str, *args: object) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "search.cli", "encode", "--model", tiny_model, *map(str, args)]
        shell = ["bash", "-c", f'exec "$@" {redirect}', "_", *command]
        return subprocess.run(shell, capture_output=True, text=True, timeout=300)

    source = tmp_path / "texts.txt"
    source.write_text("one\n", encoding="utf-8")
    assert_clean_failure(closed(">&-", source), "stdout is closed")
    assert_clean_failure(closed("<&-"), "stdin is closed")


def test_a_second_tune_to_one_output_is_refused_before_it_trains(tmp_path, tiny_model, monkeypatch):
    from indexer.embedding.strategy import Strategy
    from indexer.encoders import training
    from search.studies.tuning import read_labels, tune
    from tests.helpers import positive_pairs

    labels = read_labels(pairs=positive_pairs(tmp_path))
    out, trained = tmp_path / "tuned", []

    def training_run(*args: object, **kwargs: object) -> None:
        trained.append(1)
        assert len(trained) == 1, "the second tune trained"
        with pytest.raises(IndexLocked, match="another semsearch process is writing"):
            tune(labels, out, Strategy(model=tiny_model))
        raise KeyboardInterrupt  # the first run stops here

    monkeypatch.setattr(training, "fine_tune", training_run)
    with pytest.raises(KeyboardInterrupt):
        tune(labels, out, Strategy(model=tiny_model))
    assert trained == [1] and not out.exists() and hidden(tmp_path, "tuned") == []


@pytest.fixture
def umask() -> Callable[[int], None]:
    old = os.umask(0o022)
    yield lambda mask: os.umask(mask)
    os.umask(old)


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_encode_output_follows_the_umask_keeps_a_replaced_mode_and_writes_through_a_link(
    tmp_path, texts, encoding, umask
):
    umask(0o027)
    encode_file(texts, tmp_path / "new.npy", encoding)
    assert mode(tmp_path / "new.npy") == 0o640
    private = tmp_path / "private.npy"
    private.write_bytes(b"old")
    private.chmod(0o600)
    umask(0o022)
    encode_file(texts, private, encoding)
    assert mode(private) == 0o600 and np.load(private).shape[0] == 3
    (tmp_path / "real").mkdir()
    link = tmp_path / "link.npy"
    link.symlink_to(tmp_path / "real" / "vectors.npy")
    encode_file(texts, link, encoding)
    assert link.is_symlink() and np.load(tmp_path / "real" / "vectors.npy").shape[0] == 3
    assert hidden(tmp_path, "link.npy") == [] and hidden(tmp_path / "real", "vectors.npy") == []


def test_export_and_tune_follow_the_umask(tmp_path, tiny_model, umask, monkeypatch):
    from indexer.embedding.strategy import Strategy
    from indexer.encoders import training
    from indexer.writing.export import export_encoder
    from search.studies.tuning import read_labels, tune
    from tests.helpers import positive_pairs

    index = build_faq(tmp_path, tiny_model)
    umask(0o027)
    export_encoder(index, tmp_path / "onnx")
    labels = read_labels(pairs=positive_pairs(tmp_path))

    class OneEpoch(training.Budget):
        """A short budget (the modes are checked, not the training), the class's defaults kept:
        ``tune`` reads ``Budget.learning_rate`` where none is given."""

        def __init__(self, *args: object) -> None:
            super().__init__(1, None, 8, 1e-3, 0, evaluations=1)

    monkeypatch.setattr(training, "Budget", OneEpoch)
    tune(labels, tmp_path / "tuned", Strategy(model=tiny_model))
    for made in (tmp_path / "onnx", tmp_path / "tuned"):
        assert mode(made) == 0o750, made
        files = [p for p in made.rglob("*") if p.is_file()]
        assert files and {p.name: mode(p) for p in files} == {p.name: 0o640 for p in files}


@pytest.mark.parametrize("directory", [False, True])
def test_a_stop_the_moment_the_staging_exists_leaves_nothing(tmp_path, monkeypatch, directory):
    """A SIGTERM that lands just after the staging file or directory is made still ends through
    the clean-up: nothing is left beside the output, with other threads running (ONNX Runtime's:
    the kernel may hand the signal to any of them)."""
    import fcntl
    import signal
    import threading

    from indexer.files import staged_dir, staged_file, stop_on_sigterm

    plain = fcntl.flock

    def stopped_at_once(fd: int, operation: int) -> None:
        os.kill(os.getpid(), signal.SIGTERM)  # the staging exists: the stop arrives now
        plain(fd, operation)

    before = signal.getsignal(signal.SIGTERM)
    stop_on_sigterm()
    monkeypatch.setattr(fcntl, "flock", stopped_at_once)
    done = threading.Event()
    other = threading.Thread(target=done.wait)
    other.start()
    try:
        with pytest.raises(SystemExit), (staged_dir if directory else staged_file)(tmp_path / "out"):
            pass
    finally:
        signal.signal(signal.SIGTERM, before)
        done.set()
        other.join()
    assert list(tmp_path.iterdir()) == []


def cli_run(*args: object) -> object:
    """``semsearch ARGS`` in this process (``CliRunner``): its exit code and stderr."""
    from click.testing import CliRunner

    from search.cli import cli

    return CliRunner().invoke(cli, [str(a) for a in args])


def each_output(tmp_path: Path, tiny_model: str, texts: str) -> dict[str, Callable[[Path], list[object]]]:
    """Each command that writes an output path, as the arguments that write ``place`` quickly
    (the tiny model, one epoch)."""
    from tests.helpers import positive_pairs, sentence

    pairs = positive_pairs(tmp_path)
    scored = tmp_path / "scored.tsv"
    rows = [f"{sentence(i)}\t{sentence(i, 1)}\t{5 * (i % 2)}" for i in range(40)]
    scored.write_text("sentence1\tsentence2\tscore\n" + "\n".join(rows) + "\n", encoding="utf-8")
    index = build_faq(tmp_path, tiny_model)
    fast = ["--model", tiny_model, "--epochs", "1", "--pairs-per-step", "16"]
    cross = ["tune", "--cross-encoder", "--pairs", scored, "--index", index, *fast]
    return {
        "tune": lambda place: ["tune", "--pairs", pairs, *fast, "-o", place],
        "tune --cross-encoder": lambda place: [*cross, "-o", place],
        "encode": lambda place: ["encode", texts, "--model", tiny_model, "-o", place / "v.npy"],
        "export-encoder": lambda place: ["export-encoder", index, "-o", place],
        "index": lambda place: ["index", texts, "-o", place, "--model", tiny_model],
    }


def test_every_output_in_missing_folders_makes_them(tmp_path, tiny_model, texts):
    """As ``index -o a/b/idx`` does, every command that writes a path makes its missing folders."""
    for name, command in each_output(tmp_path, tiny_model, texts).items():
        place = tmp_path / name.replace(" ", "") / "new" / "out"
        result = cli_run(*command(place))
        assert result.exit_code == 0, (name, result.output)
        assert place.exists(), name
        assert hidden(place.parent, "out") == [], name


def test_an_output_under_a_file_is_one_line_and_makes_nothing(tmp_path, tiny_model, texts):
    """A folder of the output's path that is a file: one line naming it, exit 1, nothing made."""
    in_the_way = tmp_path / "taken"
    in_the_way.write_text("a file\n", encoding="utf-8")
    for name, command in each_output(tmp_path, tiny_model, texts).items():
        for place in (in_the_way / "out", in_the_way / "deeper" / "out"):
            result = cli_run(*command(place))
            errors = [line for line in result.output.splitlines() if line.startswith("Error: ")]
            assert result.exit_code == 1 and len(errors) == 1, (name, result.output)
            assert f"{in_the_way} is a file, not a folder" in errors[0], (name, errors[0])
            assert "Traceback" not in result.output and in_the_way.is_file(), name
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_a_failed_run_removes_the_folders_it_made(tmp_path, tiny_model, texts, monkeypatch, encoding):
    """A run that fails after making an output's folders leaves neither a half output nor them."""
    from indexer.embedding.strategy import Strategy
    from indexer.encoders import training
    from search.studies.tuning import read_labels, tune
    from tests.helpers import positive_pairs

    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    with pytest.raises(BadInput):
        encode_file(str(empty), tmp_path / "made" / "deeper" / "v.npy", encoding)
    assert not (tmp_path / "made").exists()

    def failing(*args: object, **kwargs: object) -> None:
        raise BadInput("stopped while training")

    monkeypatch.setattr(training, "fine_tune", failing)
    labels = read_labels(pairs=positive_pairs(tmp_path))
    (tmp_path / "kept").mkdir()
    with pytest.raises(BadInput, match="stopped while training"):
        tune(labels, tmp_path / "kept" / "new" / "tuned", Strategy(model=tiny_model))
    assert list((tmp_path / "kept").iterdir()) == []
