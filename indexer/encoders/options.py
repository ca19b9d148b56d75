"""How to embed, as asked, resolved once: every entry point (``build_index``, ``add_to_index``,
``encode``, ``evaluate``, ``sweep``, ``tune``, the server) builds one ``EmbeddingOptions`` from its
arguments and hands it down to ``indexer.encoders.factory``, which decides from it alone.

Resolving checks what can be checked before anything loads: a GPU asked for and missing, a
precision the device cannot run, a worker count below one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from indexer.encoders.devices import CPU, Placement, placement
from indexer.errors import BadInput

DEVICE = "auto"
"""The one ``--device`` default: a GPU torch sees for bulk work (``indexer.encoders.devices``);
a server's queries run the index's graph on the CPU unless a GPU is named."""
PRECISION = "auto"
BATCH_SIZE = 32
"""Most texts in one forward pass on the CPU (``indexer.embedding.batching``)."""


@dataclass(frozen=True)
class EmbeddingOptions:
    """Where and how texts are embedded: the device and precision (resolved), the batch size, and
    Ray (an address and a worker count) or not. ``provider``: ONNX Runtime's execution provider
    (``None``: the CPU)."""

    placement: Placement = CPU
    batch_size: int = BATCH_SIZE
    ray: str | None = None
    ray_workers: int | None = None
    provider: str | None = None

    @classmethod
    def resolve(
        cls,
        device: str | None = DEVICE,
        precision: str | None = PRECISION,
        *,
        batch_size: int = BATCH_SIZE,
        ray: str | None = None,
        ray_workers: int | None = None,
        provider: str | None = None,
        serving: bool = False,
    ) -> EmbeddingOptions:
        """The options as asked, resolved on this machine. ``serving``: for a server's queries,
        where ``auto`` is the CPU (one query at a time runs the index's graph)."""
        if batch_size < 1:
            raise BadInput(f"--batch-size must be at least 1, not {batch_size}")
        if ray_workers is not None and ray_workers < 1:
            raise BadInput(f"Ray workers must be at least 1, not {ray_workers}")
        if serving and (device or DEVICE).strip().lower() == "auto":
            device = "cpu"
        return cls(placement(device, precision), batch_size, ray, ray_workers, provider)

    def here(self) -> EmbeddingOptions:
        """The same options without Ray: what each Ray worker embeds with."""
        return replace(self, ray=None, ray_workers=None)
