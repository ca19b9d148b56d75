"""Embedding on Ray: the corpus is cut into contiguous partitions, a pool of Ray actors (each picks
its encoder once, with the index's resolved strategy: ``indexer.encoders.factory``) embeds them,
and the driver puts the parts back in corpus order with ``shards.combine`` (the merge
``semsearch merge`` uses), so the index that follows is written exactly as a local build writes
it: same entries, same row ids, same transform fitted on the whole corpus, same atomic swap.

Ray tasks on actors rather than Ray Data: Ray Data pulls in pyarrow and pandas and would hand
rows through Arrow blocks; the corpus is already read (and its rejected rows counted) by the
driver, so the workers need nothing but texts. A worker process that dies is restarted and its
partition retried (``RETRIES``); a partition that still fails fails the run, before anything is
written, so the previous index stays live.

``address="local"`` starts a Ray runtime on this machine bound to 127.0.0.1 alone (no dashboard)
and stops it afterwards; any other address joins that cluster (``auto``, ``ray://host:10001``,
``host:6379``), whose nodes must have semsearch and the model installed.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from indexer.embedding.strategy import Strategy
from indexer.encoders.base import Choice
from indexer.errors import BadInput, SemsearchError, StrategyConflict, WorkerFailed
from indexer.progress import Share
from indexer.reading.corpus import Entry

LOCAL = "local"
LOOPBACK_ONLY = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
"""Set to 0, Ray takes 127.0.0.1 as the node address, and every server it starts binds it."""
RETRIES = 2
"""Restarts of a dead worker, and retries of the partition it held, before the run fails."""
PARTITIONS_PER_WORKER = 4
"""More partitions than workers: a slow or restarted worker holds back less of the run."""
CONNECT_TIMEOUT = 10.0
"""Seconds to reach a cluster's address before joining it: Ray itself retries an address where
nothing answers for minutes, deaf to SIGINT and SIGTERM meanwhile."""


def import_ray(address: str) -> Any:
    """Ray, or one clear ``BadInput`` line saying how to install it. A local runtime keeps every
    socket on 127.0.0.1: Ray reads that choice from its environment when it is first imported."""
    if address == LOCAL:
        if sys.modules.get("ray") is not None and os.environ.get(LOOPBACK_ONLY) != "0":
            raise BadInput(
                f"Ray was imported before semsearch could keep a local runtime on 127.0.0.1: "
                f"set {LOOPBACK_ONLY}=0 before importing it"
            )
        os.environ.setdefault(LOOPBACK_ONLY, "0")
    try:
        import ray
    except ImportError:
        raise BadInput("--ray needs Ray: pip install 'semsearch[ray]'") from None
    return ray


@contextlib.contextmanager
def connected(address: str, workers: int | None = None) -> Iterator[Any]:
    """Ray, initialised for ``address`` (see module doc) unless it already is in this process:
    a runtime this call starts is shut down when it ends."""
    import logging

    ray = import_ray(address)
    if ray.is_initialized():
        yield ray
        return
    options: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.WARNING}
    try:
        if address == LOCAL:
            # workers at the driver's priority (Ray's default, nice 15, starves them on a busy machine)
            system = {"worker_niceness": 0}
            cpus = workers or os.cpu_count() or 1
            ray.init(num_cpus=cpus, include_dashboard=False, _system_config=system, **options)
        else:
            _reachable(address)
            ray.init(address=address, **options)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        raise BadInput(f"cannot start or join Ray at {address!r}: {exc}") from None
    try:
        yield ray
    finally:
        ray.shutdown()


def _reachable(address: str) -> None:
    """Raise ``BadInput`` unless something accepts a TCP connection at the cluster's address
    within ``CONNECT_TIMEOUT``. ``auto`` is looked up as Ray looks it up; none found is Ray's to say."""
    import socket

    target: str | None = address.removeprefix("ray://")
    if target == "auto":
        from ray._private.services import canonicalize_bootstrap_address

        target = canonicalize_bootstrap_address(target)
        if target is None:
            return
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        raise BadInput(f"--ray {address!r} is not a Ray address: give HOST:PORT, ray://HOST:PORT or auto")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT):
            pass
    except TimeoutError:
        raise BadInput(f"cannot join Ray at {address!r}: no answer within {CONNECT_TIMEOUT:g} s") from None
    except OSError as exc:
        raise BadInput(f"cannot join Ray at {address!r}: {exc.strerror or exc}") from None


class _Worker:
    """One Ray actor: the model loaded once, then one partition per call."""

    def __init__(self, strategy: Strategy, batch_size: int, before: Callable[[int], None] | None):
        from indexer.encoders.factory import encoder_for

        self.encoder = encoder_for(strategy, batch_size=batch_size)  # as a build embeds
        self.before = before

    def embed(
        self, number: int, texts: list[str], documents: bool, role: str = "query"
    ) -> tuple[Strategy, np.ndarray, np.ndarray]:
        if self.before is not None:
            self.before(number)
        if documents:
            vectors, owners = self.encoder.embed_documents(texts)
        else:
            vectors, owners = self.encoder.embed(texts, role=role), np.arange(len(texts), dtype=np.int64)
        return self.encoder.strategy, vectors, owners


def embed_on_ray(
    entries: Sequence[Entry],
    strategy: Strategy,
    address: str = LOCAL,
    *,
    workers: int | None = None,
    batch_size: int = 32,
    before_partition: Callable[[int], None] | None = None,
    documents: bool = True,
    role: str = "query",
) -> tuple[np.ndarray, np.ndarray]:
    """Vectors of the entries' texts and the entry of each, as ``Encoder.embed_documents`` gives
    them (``documents``; else as ``Encoder.embed`` does, as a ``role``), embedded by ``workers`` Ray actors
    (default: one per CPU of the cluster). ``strategy`` must be resolved (the index's); a worker
    whose model is another fails the run with ``StrategyConflict``. ``before_partition`` runs in
    the worker before each partition (tests kill a worker there)."""
    from indexer.writing.shards import combine

    if workers is not None and workers < 1:
        raise BadInput(f"Ray workers must be at least 1, not {workers}")
    if not entries:
        raise BadInput("nothing to embed")
    with connected(address, workers) as ray:
        from ray.exceptions import RayError, RayTaskError
        from ray.util import ActorPool

        count = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        partitions = min(len(entries), count * PARTITIONS_PER_WORKER)
        bounds = np.linspace(0, len(entries), partitions + 1).astype(int).tolist()
        spans = list(zip(bounds[:-1], bounds[1:], strict=True))
        actor = ray.remote(num_cpus=1, max_restarts=RETRIES, max_task_retries=RETRIES)(_Worker)
        workers = [
            actor.remote(strategy, batch_size, before_partition) for _ in range(min(count, len(spans)))
        ]
        pool = ActorPool(workers)
        jobs = [(i, [e.text for e in entries[a:b]], documents, role) for i, (a, b) in enumerate(spans)]
        try:
            done = list(pool.map(lambda worker, job: worker.embed.remote(*job), jobs))
        except RayTaskError as exc:
            if isinstance(exc.cause, SemsearchError):
                raise type(exc.cause)(str(exc.cause)) from None
            raise WorkerFailed(f"a Ray worker failed: {_first_line(exc.cause or exc)}") from None
        except RayError as exc:
            raise WorkerFailed(f"a Ray worker failed after {RETRIES} retries: {_first_line(exc)}") from None
    resolved, _, vectors, owners = combine(
        [(found, entries[a:b], v, o) for (found, v, o), (a, b) in zip(done, spans, strict=True)],
        [f"Ray partition {i}" for i in range(len(spans))],
    )
    if strategy.differences(resolved):
        raise StrategyConflict(
            f"the Ray workers resolved the strategy as {resolved.describe()}, not {strategy.describe()}"
        )
    return vectors, owners


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


class RayEncoder:
    """An ``Encoder`` whose texts are embedded on Ray workers (``embed_on_ray``): what a build or an
    add hands its texts to when asked for ``--ray`` (``indexer.encoders.factory.encoder_for``)."""

    def __init__(self, strategy: Strategy, address: str, workers: int | None = None, batch_size: int = 32):
        self.strategy, self.address, self.workers, self.batch_size = strategy, address, workers, batch_size
        self.choice = Choice("ray", f"--ray {address}: each worker picks its encoder for the strategy")

    def embed(
        self, texts: Sequence[str], *, progress: Share | None = None, role: str = "query"
    ) -> np.ndarray:
        """Workers report nothing back while they run: ``progress`` is not told (a build's bar
        moves per part)."""
        return self._on_ray(texts, documents=False, role=role)[0]

    def embed_documents(
        self, texts: Sequence[str], *, progress: Share | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        return self._on_ray(texts, documents=True)

    def _on_ray(
        self, texts: Sequence[str], *, documents: bool, role: str = "query"
    ) -> tuple[np.ndarray, np.ndarray]:
        entries = [Entry(str(i), text, {}) for i, text in enumerate(texts)]
        return embed_on_ray(
            entries,
            self.strategy,
            self.address,
            workers=self.workers,
            batch_size=self.batch_size,
            documents=documents,
            role=role,
        )
