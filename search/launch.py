"""The ``semsearch`` command's entry point. The CLI is imported inside the guard, so that Ctrl-C
while its modules load (a second or more: click, NumPy, ONNX Runtime) ends as any interrupt
does, with one line and exit 130, not a traceback. This module imports nothing itself."""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from search.cli import main as run

        run()
    except KeyboardInterrupt:  # commands handle their own: this is one before or after them
        print("Interrupted: nothing was changed.", file=sys.stderr)
        raise SystemExit(130) from None
