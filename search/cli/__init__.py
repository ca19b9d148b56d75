"""``semsearch``: click commands that are thin shells over the library, one module per job
(``writing``, ``reading``, ``studying``, ``tuning``) over the shared ``options`` and ``printing``.
Every user mistake ends as one line on stderr and a non-zero exit."""

from __future__ import annotations

import gc
import os
import sys
from typing import Any

import click

from indexer.errors import SemsearchError
from search.cli import reading, serving, studying, tuning, writing


class _UserError(click.ClickException):
    def __init__(self, error: SemsearchError):
        super().__init__(str(error))
        self.exit_code = error.exit_code


class _Group(click.Group):
    """Turns library errors into click's one-line errors; never shows a traceback by default."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except SemsearchError as exc:
            raise _UserError(exc) from None
        except KeyboardInterrupt:
            click.echo("Interrupted: nothing was changed.", err=True)
            ctx.exit(130)
        except BrokenPipeError:
            sys.stderr.close()  # a reader like `head` went away: not an error worth a message
            ctx.exit(0)
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except Exception as exc:
            if os.environ.get("SEMSEARCH_DEBUG"):
                raise
            raise click.ClickException(
                f"unexpected {type(exc).__name__}: {exc} (SEMSEARCH_DEBUG=1 shows a traceback)"
            ) from None


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
