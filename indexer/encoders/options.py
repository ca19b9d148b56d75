"""How to embed, as asked: one ``EmbeddingOptions`` travels from the caller (the CLI's
``search.cli.embedding.embedding_options``, or a Python caller) down to
``indexer.encoders.factory``, which decides from it alone. No library function takes a device,
precision, batch size or Ray address of its own: each takes ``options: EmbeddingOptions | None``.

``None`` and a bare ``EmbeddingOptions()`` mean the same: every default below, ``auto`` included,
which is resolved where it is used (``placement``, at its first reading): a GPU torch sees for
bulk work, the CPU for a server's queries (``serving``). ``checked`` resolves it at once: a GPU
asked for and missing, or a precision the device cannot run, is said before anything loads.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

from indexer.encoders.devices import AUTO, Placement, device_name, placement
from indexer.errors import BadInput

DEVICE = AUTO
"""The one ``--device`` default: a GPU torch sees for bulk work (``indexer.encoders.devices``);
a server's queries run the index's graph on the CPU unless a GPU is named."""
PRECISION = AUTO
"""The one ``--precision`` default: fp16 on a GPU, fp32 on the CPU."""
BATCH_SIZE = 32
"""Texts of a whole window in one forward pass on the CPU; shorter ones go more to a pass
(``indexer.embedding.batching``)."""


@dataclass(frozen=True)
class EmbeddingOptions:
    """Where and how texts are embedded, as asked: the device and precision (resolved on first use:
    ``placement``), the batch size, Ray (an address and a worker count) or not, ONNX Runtime's
    execution provider (``None``: the CPU's), and ``serving``: for a server's queries, where
    ``auto`` is the CPU (one query at a time runs the index's graph). ``trust_remote_code``: run a
    model's own code (``auto_map`` in its ``config.json``), as transformers does with that flag;
    asked again by every command on an index whose strategy says its model has some
    (``indexer.encoders.factory.encoder_for``)."""

    device: str = DEVICE
    precision: str = PRECISION
    batch_size: int = BATCH_SIZE
    ray: str | None = None
    ray_workers: int | None = None
    provider: str | None = None
    serving: bool = False
    trust_remote_code: bool = False

    def __post_init__(self) -> None:
        """What can be checked without looking at the machine, checked at once."""
        if self.batch_size < 1:
            raise BadInput(f"--batch-size must be at least 1, not {self.batch_size}")
        if self.ray_workers is not None and self.ray_workers < 1:
            raise BadInput(f"Ray workers must be at least 1, not {self.ray_workers}")
        try:
            device_name(self.device)
        except BadInput as error:
            raise BadInput(f"--device: {error}") from None

    @classmethod
    def at(cls, on: Placement, **rest: object) -> EmbeddingOptions:
        """Options already placed on ``on`` (a Ray worker's, a test's bf16 on the CPU): nothing is
        resolved again."""
        options = cls(on.device, on.precision, **rest)  # type: ignore[arg-type]
        options.__dict__["placement"] = on
        return options

    @cached_property
    def placement(self) -> Placement:
        """The device and precision, resolved on this machine (``indexer.encoders.devices``)."""
        asked = "cpu" if self.serving and self.device.strip().lower() == AUTO else self.device
        return placement(asked, self.precision)

    def checked(self) -> EmbeddingOptions:
        """These options with their placement resolved now: a GPU asked for and missing is one
        ``BadInput`` before anything is read or written."""
        self.placement  # noqa: B018 (resolves and keeps it)
        return self

    def for_serving(self) -> EmbeddingOptions:
        """The same options for a server's queries (``auto``: the CPU)."""
        return self if self.serving else replace(self, serving=True)

    def here(self) -> EmbeddingOptions:
        """The same options, placed where they resolved, without Ray: what each Ray worker embeds with."""
        return EmbeddingOptions.at(
            self.placement,
            batch_size=self.batch_size,
            provider=self.provider,
            trust_remote_code=self.trust_remote_code,
        )


def given(options: EmbeddingOptions | None) -> EmbeddingOptions:
    """``options``, or the defaults where none were given (the same thing)."""
    return options if options is not None else EmbeddingOptions()
