"""Embedding on Ray: the texts are cut into contiguous partitions, a pool of Ray actors embeds them
and the driver puts the parts back in order, so the index that follows is written exactly as a
local build writes it: same entries, same row ids, same transform fitted on the whole corpus, same
atomic swap. Each actor builds its encoder once from the driver's ``Decision`` (its placement,
batching and the graph the index holds: ``indexer.encoders.factory``), on a share of a GPU where
the decision is a GPU, and every partition comes back with the decision its worker made: one that
embedded otherwise (another runtime, device or precision) fails the run, so what ``info`` records
is what the workers did.

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
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from indexer.embedding.strategy import Strategy
from indexer.encoders.base import Decision
from indexer.encoders.devices import Placement
from indexer.encoders.options import EmbeddingOptions
from indexer.errors import BadInput, SemsearchError, StrategyConflict, WorkerFailed
from indexer.progress import Share

if TYPE_CHECKING:
    from indexer.encoders.base import Encoder

LOCAL = "local"
LOOPBACK_ONLY = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
"""Set to 0, Ray takes 127.0.0.1 as the node address, and every server it starts binds it."""
RETRIES = 2
"""Restarts of a dead worker, and retries of the partition it held, before the run fails."""
PARTITIONS_PER_WORKER = 4
"""More partitions than workers: a slow or restarted worker holds back less of the run."""
RAY_PART_ENTRIES = 32_768
"""Entries a build hands Ray at a time (eight times a local build's part): the workers pick up the
model once per part, so a part is larger than one a single process embeds."""
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
    sigterm = signal.getsignal(signal.SIGTERM)
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
    finally:
        # Ray's driver swaps in a SIGTERM handler of its own (sys.exit(15)), which a test runner
        # takes for one failing test and runs on; the process keeps the handler it had.
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, sigterm)
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


def worker_options(decision: Decision, options: EmbeddingOptions) -> EmbeddingOptions:
    """What a worker embeds with: the driver's options on the decision's kind of device, its own
    GPU where that is one (Ray numbers a worker's GPUs from 0)."""
    here = options.here()
    if decision.placement.on_cpu:
        return here
    gpu = Placement("cuda:0", here.placement.precision)
    return EmbeddingOptions.at(
        gpu, batch_size=here.batch_size, provider=here.provider, trust_remote_code=here.trust_remote_code
    )


class _Worker:
    """One Ray actor: the model loaded once, as the driver decided (``build``: the factory's call
    for it), then one partition per call."""

    def __init__(self, build: Callable[[], Encoder], before: Callable[[int], None] | None):
        self.encoder = build()
        self.before = before

    def embed(
        self, number: int, texts: list[str], documents: bool, role: str = "query"
    ) -> tuple[Strategy, Decision, np.ndarray, np.ndarray]:
        if self.before is not None:
            self.before(number)
        if documents:
            vectors, owners = self.encoder.embed_documents(texts)
        else:
            vectors, owners = self.encoder.embed(texts, role=role), np.arange(len(texts), dtype=np.int64)
        return self.encoder.strategy, replace(self.encoder.decision, graph=None), vectors, owners


def embed_on_ray(
    texts: Sequence[str],
    strategy: Strategy,
    decision: Decision,
    build: Callable[[], Encoder],
    *,
    before_partition: Callable[[int], None] | None = None,
    documents: bool = True,
    role: str = "query",
) -> tuple[np.ndarray, np.ndarray, list[Decision]]:
    """Vectors of ``texts`` and the text of each, as ``Encoder.embed_documents`` gives them
    (``documents``; else as ``Encoder.embed`` does, as a ``role``), embedded by
    ``decision.workers`` Ray actors (default: one per CPU of the cluster) at ``decision.ray``, each
    building its encoder with ``build``, and the decision each partition's worker made.
    ``strategy`` must be resolved (the index's); a worker whose model is another fails the run
    with ``StrategyConflict``, one that embedded otherwise than ``decision`` with
    ``WorkerFailed``. ``before_partition`` runs in the worker before each partition (tests kill a
    worker there)."""
    address, workers = decision.ray or LOCAL, decision.workers
    if workers is not None and workers < 1:
        raise BadInput(f"Ray workers must be at least 1, not {workers}")
    if not texts:
        raise BadInput("nothing to embed")
    with connected(address, workers) as ray:
        from ray.exceptions import RayError, RayTaskError
        from ray.util import ActorPool

        count = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        partitions = min(len(texts), count * PARTITIONS_PER_WORKER)
        bounds = np.linspace(0, len(texts), partitions + 1).astype(int).tolist()
        spans = list(zip(bounds[:-1], bounds[1:], strict=True))
        actors = min(count, len(spans))
        gpus = 0 if decision.placement.on_cpu else ray.cluster_resources().get("GPU", 0) / actors
        if not decision.placement.on_cpu and not gpus:
            raise BadInput(f"the Ray cluster at {address!r} has no GPU to embed on (--device cpu)")
        actor = ray.remote(num_cpus=1, num_gpus=gpus, max_restarts=RETRIES, max_task_retries=RETRIES)(_Worker)
        pool = ActorPool([actor.remote(build, before_partition) for _ in range(actors)])
        jobs = [(i, list(texts[a:b]), documents, role) for i, (a, b) in enumerate(spans)]
        try:
            done = list(pool.map(lambda worker, job: worker.embed.remote(*job), jobs))
        except RayTaskError as exc:
            if isinstance(exc.cause, SemsearchError):
                raise type(exc.cause)(str(exc.cause)) from None
            raise WorkerFailed(f"a Ray worker failed: {_first_line(exc.cause or exc)}") from None
        except RayError as exc:
            raise WorkerFailed(f"a Ray worker failed after {RETRIES} retries: {_first_line(exc)}") from None
    for number, (found, made, _, _) in enumerate(done):
        if strategy.differences(found):
            raise StrategyConflict(
                f"the Ray workers resolved the strategy as {found.describe()}, not {strategy.describe()}"
            )
        if not decision.same_work(made):
            raise WorkerFailed(
                f"Ray partition {number} was embedded by {made.runtime} on {made.placement.describe()}, "
                f"not {decision.runtime} on {decision.placement.describe()} as decided"
            )
    vectors = np.concatenate([v for _, _, v, _ in done]).astype(np.float32, copy=False)
    owners = np.concatenate([o + a for (_, _, _, o), (a, _) in zip(done, spans, strict=True)])
    return vectors, owners, [made for _, made, _, _ in done]


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


class RayEncoder:
    """An ``Encoder`` whose texts are embedded on Ray workers (``embed_on_ray``), as ``decision``
    says, each worker's encoder made by ``build`` (``indexer.encoders.factory.encoder_for`` makes
    one for ``--ray``). ``used``: the decisions the workers reported, each the same work as
    ``decision``; ``before_partition``: as ``embed_on_ray`` takes it."""

    part_entries = RAY_PART_ENTRIES
    """Entries a build hands it at a time."""

    def __init__(self, strategy: Strategy, decision: Decision, build: Callable[[], Encoder]):
        self.strategy, self.decision, self.build = strategy, decision, build
        self.used: list[Decision] = []
        self.before_partition: Callable[[int], None] | None = None

    def session(self) -> contextlib.AbstractContextManager[Any]:
        """Ray, started or joined for as long as the ``with`` lasts: every part a build embeds
        inside it shares one runtime (each ``embed`` alone starts and stops its own)."""
        return connected(self.decision.ray or LOCAL, self.decision.workers)

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
        vectors, owners, used = embed_on_ray(
            texts,
            self.strategy,
            self.decision,
            self.build,
            before_partition=self.before_partition,
            documents=documents,
            role=role,
        )
        self.used += used
        return vectors, owners
