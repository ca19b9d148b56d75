"""``python -m search.cli``: the ``semsearch`` command."""

from search.cli import main

main()
