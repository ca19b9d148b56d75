"""Where a network runs (``--device``) and at what precision (``--precision``).

``auto`` takes the first CUDA GPU when torch sees one, else the CPU. Deciding that must not cost
a CPU-only process the seconds of importing torch: torch is imported only where an NVIDIA driver
is present (or CUDA was asked for by name). Asking for CUDA where torch sees none is one clear
``BadInput``, before anything is read or written.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from indexer.embedding.strategy import AUTO
from indexer.errors import BadInput

PRECISIONS = (AUTO, "fp32", "fp16", "bf16")
"""What ``--precision`` takes: ``auto`` is fp16 on a GPU (its tensor cores; vectors within ~1e-3
of fp32, the same rankings on the shared dev sets) and fp32 on the CPU (where halves are slower)."""
_DRIVER = Path("/proc/driver/nvidia/version")


@dataclass(frozen=True)
class Placement:
    """A resolved device (``cpu`` or ``cuda:N``) and precision (``fp32``, ``fp16`` or ``bf16``)."""

    device: str = "cpu"
    precision: str = "fp32"

    @property
    def on_cpu(self) -> bool:
        return self.device == "cpu"

    def describe(self) -> str:
        return f"{self.device}, {self.precision}"

    def to_dict(self) -> dict[str, str]:
        return {"device": self.device, "precision": self.precision}


CPU = Placement()


def _driver_present() -> bool:
    """An NVIDIA driver on this machine (cheap: no torch import where there is none)."""
    return _DRIVER.exists() or Path("/dev/nvidia0").exists()


def _cuda_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def device_name(device: str) -> str:
    """``device`` as a name ``--device`` takes (auto, cpu, cuda or cuda:N, the N-th GPU torch sees),
    lower-cased; any other, empty included (a shell variable left unset), is refused by name."""
    name = device.strip().lower()
    if name in (AUTO, "cpu") or re.fullmatch(r"cuda(?::\d+)?", name):
        return name
    shown = "it is empty" if not name else f"not {device.strip()!r}"
    raise BadInput(f"give auto, cpu, cuda or cuda:N ({shown})")


def placement(device: str | None = None, precision: str | None = None) -> Placement:
    """``device`` and ``precision`` as asked (``None``: ``auto``), resolved on this machine."""
    try:
        device = device_name(AUTO if device is None else device)
    except BadInput as error:
        raise BadInput(f"--device: {error}") from None
    precision = (precision or AUTO).strip().lower()
    if precision not in PRECISIONS:
        raise BadInput(f"--precision {precision!r}: choose one of {', '.join(PRECISIONS)}")
    if device == AUTO:
        seen = os.environ.get("CUDA_VISIBLE_DEVICES") != "" and _driver_present() and _cuda_count()
        on = "cuda:0" if seen else "cpu"
    elif device == "cpu":
        on = "cpu"
    else:  # cuda or cuda:N, as device_name admits
        count = _cuda_count()
        number = int(device.partition(":")[2] or 0)
        if count == 0:
            raise BadInput(f"--device {device}: torch sees no CUDA GPU on this machine (use cpu or auto)")
        if number >= count:
            raise BadInput(f"--device {device}: torch sees {count} CUDA GPU(s) (cuda:0..cuda:{count - 1})")
        on = f"cuda:{number}"
    if on == "cpu" and precision in ("fp16", "bf16"):
        raise BadInput(f"--precision {precision} runs on a GPU only (the CPU embeds in fp32)")
    if precision == AUTO:
        precision = "fp32" if on == "cpu" else "fp16"
    return Placement(on, precision)
