"""The one exception users see: its message is printed as a single line by the CLI."""


class SemsearchError(Exception):
    """Bad input, a missing or damaged index, a model that cannot be loaded: anything the user can fix."""
