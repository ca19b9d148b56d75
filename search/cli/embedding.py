"""The options that say where and how texts are embedded (``--device``, ``--precision``,
``--batch-size``, ``--ray``, ``--ray-workers``, ``--provider``), declared once: ``embedding_options``
turns those a command takes into the one ``EmbeddingOptions`` the command hands the library."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click

from indexer.encoders.devices import PRECISIONS
from indexer.encoders.options import BATCH_SIZE, DEVICE, PRECISION
from search.cli.options import Decorator, stacked

DEVICE_FLAGS = "device"
BATCH_FLAG = "batch"
RAY_FLAGS = "ray"
PROVIDER_FLAG = "provider"
CODE_FLAG = "code"


def _device(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """A device named as ``--device`` takes them: any other is a usage error (exit 2), before any
    work; whether this machine has it is decided later, with the rest of the placement."""
    from indexer.encoders.devices import device_name
    from indexer.errors import BadInput

    try:
        return device_name(value)
    except BadInput as error:
        raise click.BadParameter(str(error)) from None


FLAGS: dict[str, Decorator] = {
    DEVICE_FLAGS: stacked(
        click.option(
            "--device",
            default=DEVICE,
            callback=_device,
            show_default=True,
            metavar="auto|cpu|cuda|cuda:N",
            help="Where the model runs: auto takes a GPU when torch sees one (serve: the CPU, its graph).",
        ),
        click.option(
            "--precision",
            type=click.Choice(PRECISIONS),
            default=PRECISION,
            show_default=True,
            help="Network precision: auto is fp16 on a GPU, fp32 on the CPU.",
        ),
    ),
    BATCH_FLAG: click.option(
        "--batch-size",
        default=BATCH_SIZE,
        show_default=True,
        type=click.IntRange(min=1),
        help="Texts per forward pass of the model where each fills its window; shorter texts go "
        "more to a pass, within the tokens that many long ones take (larger: more memory).",
    ),
    RAY_FLAGS: stacked(
        click.option(
            "--ray",
            "ray_address",
            is_flag=False,
            flag_value="local",
            metavar="[ADDRESS]",
            help="Embed on Ray (pip install 'semsearch[ray]'): alone, a local runtime on 127.0.0.1; "
            "with an address (auto, ray://HOST:10001), that cluster.",
        ),
        click.option(
            "--ray-workers",
            type=click.IntRange(min=1),
            help="Ray actors embedding at once (default: one per CPU of the Ray cluster).",
        ),
    ),
    PROVIDER_FLAG: click.option(
        "--provider",
        help="ONNX Runtime execution provider the queries run on, e.g. CUDAExecutionProvider "
        "(default: CPUExecutionProvider); the vectors are the same.",
    ),
    CODE_FLAG: click.option(
        "--trust-remote-code",
        is_flag=True,
        help="Run the model's own code (auto_map in its config.json), as transformers does with this "
        "flag: only for a model whose code you trust. An index of such a model asks for it again.",
    ),
}
"""Each group of embedding flags: ``device`` (``--device``, ``--precision``: where the network
runs, ``indexer.encoders.devices``), ``batch`` (``--batch-size``), ``ray`` (``--ray [ADDRESS]``,
``--ray-workers N``: ``indexer.encoders.on_ray``), ``provider`` (``--provider``: where an index's
queries run on ONNX Runtime; the vectors are the same), ``code`` (``--trust-remote-code``)."""
NAMES = {
    DEVICE_FLAGS: ("device", "precision"),
    BATCH_FLAG: ("batch_size",),
    RAY_FLAGS: ("ray_address", "ray_workers"),
    PROVIDER_FLAG: ("provider",),
    CODE_FLAG: ("trust_remote_code",),
}
"""The parameters each group's flags give the command."""


def embedding_options(*groups: str, serving: bool = False) -> Decorator:
    """The flags of ``groups`` (``FLAGS``), given to the command as one ``options``
    (``EmbeddingOptions``), built once; a flag the command does not take keeps its default.
    ``serving``: the options of a server's queries (``auto`` is the CPU)."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(command)
        def wrapper(**kwargs: Any) -> Any:
            from indexer.encoders.options import EmbeddingOptions

            asked = {name: kwargs.pop(name) for group in groups for name in NAMES[group]}
            if "ray_address" in asked:
                asked["ray"] = asked.pop("ray_address")
            return command(options=EmbeddingOptions(**asked, serving=serving), **kwargs)

        return stacked(*(FLAGS[group] for group in groups))(wrapper)

    return decorate
