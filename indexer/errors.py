"""The exceptions users see. A caller tells them apart by class, never by message text; each class
carries the exit code the CLI ends with and the HTTP status the server answers with (``exit_code``,
``http_status``), so the two cannot drift apart from each other or from this table.

    SemsearchError          base of all of them
    ├── BadInput            the user can fix the input (file, option, query, filter): exit 1, 400
    │   └── FilterError     a ``--where`` condition that cannot be read or is too large
    ├── StrategyConflict    asked for another strategy than the index's: exit 3, 409
    ├── IndexLocked         another process is writing the index (or the same output): exit 4, 409
    ├── IndexDamaged        the index on disk is missing parts or inconsistent: exit 5, 503
    ├── DiskFull            a write ran out of space; the index is as it was: exit 1
    ├── ModelFailed         the model made vectors that are not finite (NaN, infinity): exit 1, 500
    └── WorkerFailed        a distributed worker died past its retries (``--ray``): exit 1
"""


class SemsearchError(Exception):
    """Anything the user can act on; its message is printed as a single line by the CLI."""

    exit_code = 1
    http_status = 400


class BadInput(SemsearchError):
    """Bad input: a file, option, query or model the user named cannot be used as given."""


class FilterError(BadInput):
    """A metadata filter that cannot be parsed, names an unknown field, or is too large."""


class StrategyConflict(SemsearchError):
    """A request for a strategy other than the one the index was built with."""

    exit_code = 3
    http_status = 409


class IndexLocked(SemsearchError):
    """Another writer holds the index's lock."""

    exit_code = 4
    http_status = 409


class IndexMoved(IndexLocked):
    """An update committed into the version a reader had open, so its rows no longer belong to
    the vectors it holds. The engine and the server reopen and retry; a caller sees this only
    when updates keep outrunning its reads."""


class IndexDamaged(SemsearchError):
    """The index on disk cannot be trusted: missing files, wrong counts, a CURRENT outside it."""

    exit_code = 5
    http_status = 503


class ModelFailed(SemsearchError):
    """The model produced vectors that are not finite (NaN or infinity): its weights or its
    exported graph are broken. No input fixes that, so a server answers it as its own fault."""

    http_status = 500


class DiskFull(SemsearchError):
    """A write found no space left; the writer undid its partial files, the index is unchanged."""


class WorkerFailed(SemsearchError):
    """A worker of a distributed run (Ray) failed past its retries; nothing was written."""
