"""``semsearch``: click commands that are thin shells over the library, one module per job
(``writing``, ``reading``, ``studying``, ``tuning``) over the shared ``options`` and ``printing``.
Every user mistake ends as one line on stderr and a non-zero exit."""

from __future__ import annotations

import gc
import os
import sys
from typing import Any, NoReturn

import click

from indexer.errors import SemsearchError
from search.cli import reading, serving, studying, tuning, writing


class _UserError(click.ClickException):
    def __init__(self, error: SemsearchError):
        super().__init__(str(error))
        self.exit_code = error.exit_code


def _interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` stems from a KeyboardInterrupt (its cause or context, at any depth): an
    extension stopped by Ctrl-C may raise another error from it (``import onnxruntime`` raises
    ``ImportError: initialization failed``), which is still the user's interrupt."""
    seen: set[int] = set()
    found: BaseException | None = exc
    while found is not None and id(found) not in seen:
        if isinstance(found, KeyboardInterrupt):
            return True
        seen.add(id(found))
        found = found.__cause__ or found.__context__
    return False


class _Group(click.Group):
    """Turns library errors into click's one-line errors; never shows a traceback by default."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except KeyboardInterrupt:
            _stopped(ctx)
        except Exception as exc:
            if _interrupted(exc):
                _stopped(ctx)
            if isinstance(exc, SemsearchError):
                raise _UserError(exc) from None
            if isinstance(exc, BrokenPipeError):
                sys.stderr.close()  # a reader like `head` went away: not an error worth a message
                ctx.exit(0)
            if os.environ.get("SEMSEARCH_DEBUG"):
                raise
            raise click.ClickException(
                f"unexpected {type(exc).__name__}: {exc} (SEMSEARCH_DEBUG=1 shows a traceback)"
            ) from None


def _stopped(ctx: click.Context) -> NoReturn:
    click.echo("Interrupted: nothing was changed.", err=True)
    ctx.exit(130)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="semsearch")
def cli() -> None:
    """Semantic search for answered questions and similar sentences."""


for command in (
    writing.index_command,
    writing.add_command,
    writing.delete_command,
    writing.compact_command,
    writing.merge_command,
    writing.calibrate_command,
    writing.export_encoder_command,
    reading.query_command,
    reading.info_command,
    reading.duplicates_command,
    serving.serve_command,
    reading.similar_command,
    reading.rerank_command,
    reading.encode_command,
    studying.evaluate_group,
    studying.sweep_group,
    studying.words_command,
    tuning.tune_command,
):
    cli.add_command(command)


def main() -> None:
    from indexer.files import stop_on_sigterm

    stop_on_sigterm()  # a stopped run cleans up as after an error: no half-written output
    try:
        cli(prog_name="semsearch")
    finally:
        # the command is done: the interpreter's exit still runs every clean-up, but its
        # collections need not trace the objects left (NumPy, FAISS, ONNX Runtime, the model's
        # tokenizer), which took 0.1-0.2 s of an index's exit
        gc.freeze()
