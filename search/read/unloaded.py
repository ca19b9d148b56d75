"""The query encoder of an index whose model may not run in this process: it runs code of its
own and ``--trust-remote-code`` was not given. Nothing is loaded, and whatever needs the model
raises the refusal (one line naming the flag), so a search that reads no query vector (keyword
mode: ``Snapshot.reads_vectors``) still answers, in the CLI, Python and the server alike."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

from indexer.errors import BadInput

if TYPE_CHECKING:
    from indexer.embedding.strategy import Strategy
    from indexer.encoders.base import Decision


class Unloaded:
    """An ``Encoder`` in shape whose every use of the model raises ``refusal``'s ``BadInput``."""

    def __init__(self, strategy: Strategy, refusal: BadInput):
        self.strategy, self.refusal = strategy, str(refusal)
        self.status = f"not loaded: {refusal}"  # what ``info`` shows for its queries

    def _refuse(self, *_: Any, **__: Any) -> NoReturn:
        raise BadInput(self.refusal)  # a new one each time: one raised again keeps its old frames

    @property
    def decision(self) -> Decision:
        self._refuse()

    @property
    def tokens(self) -> Any:
        """What the server tokenises a text by (``Encoding.tokenize``)."""
        self._refuse()

    embed = embed_documents = embed_ids = _refuse
