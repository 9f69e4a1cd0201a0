"""The embedded cluster's lifecycle, and reaching a cluster. Module state: :data:`OPEN_RUNNERS`.

Importing ``distributed`` (:func:`use_distributed`, once per process, on a path to a client or
a cluster, never before the head start's first window), starting the embedded cluster
(:func:`local_cluster`: worker processes with one thread each, so a Hugging Face tokenizer never
oversubscribes a core; its scheduler in a process of its own, it and the workers forked from one
host process, see :mod:`.spawned`), connecting to a running scheduler (:func:`open_client`) and
closing what was started, each step bounded (:func:`close_client`, :func:`close_cluster`).
Runners not closed when the interpreter exits are closed then (:func:`close_open_runners`).

The runner that computes windows there is :mod:`.runner`, its result handle :mod:`.handle`,
the jobs other than the pipeline (``prepare_tokens``) :mod:`.connect`; :mod:`.watch` waits on a
cluster, :mod:`.plugins` trims the embedded one's workers and scheduler.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import sys
import threading
import weakref
from typing import TYPE_CHECKING, Any

import dask

from ..errors import ClusterError
from . import dask_compat
from .base import Runner
from .watch import DEFAULT_TIMEOUT, probe_address

if TYPE_CHECKING:
    from distributed import Client, SpecCluster

logger = logging.getLogger(__name__)  # every message about a cluster: the runner's and its handles' too
LOCAL_HOST = "127.0.0.1"

WORKER_ENV = {
    "TOKENIZERS_PARALLELISM": "false",
    "RAYON_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
}


# The embedded cluster shares the training machine's cores, so Dask's housekeeping is paid in
# training throughput. Idle, a 2-worker cluster with Dask's defaults used ~0.16 of a core
# (event-loop ticks 50 times a second in every server, 100 profile samples a second in every
# worker, memory checks 10 times a second); with these, ~0.03. A profile sample is taken on the
# worker's event loop, which must win the GIL from the task thread and walk its stack: at 10 a
# second they cost a busy worker's event loop 1-3 ms per prose window (a tenth to a quarter,
# benchmarks/bench_task_cpu.py); at one a second the dashboard's profile still fills.
# MALLOC_TRIM_THRESHOLD_=65536, which Dask exports to its workers, also fixes glibc's mmap
# threshold at 128 KiB, so every window-sized array and tokenizer buffer was a fresh mmap:
# tokenize + pack ran ~20% slower in a worker than in a plain process; workers we start keep
# glibc's default thresholds. Anything the user set in their Dask config (or exported, for
# MALLOC_TRIM_THRESHOLD_ and MALLOC_ARENA_MAX) wins.
# Dask's bounded logs are sized for short jobs: a worker keeps low-level-log-length (1,000) of its
# one-second profile cycles twice (the call tree, and per task prefix), 24-32 KB a second in the
# soak benchmark, so a streaming worker grew by 24-32 MB over its first 17 minutes; at 300 they
# hold the last 5 minutes (the dashboard's profile page) and are full by then, as are the other
# developer logs (transitions, transfers, messages, events: most within a minute or two; each
# holds under 0.3 MB).
# The system monitor keeps 300 samples (10 minutes at 2 s, under 0.1 MB) instead of 7,200 (4 h).
# MALLOC_ARENA_MAX=1: a worker's threads (event loop, task thread, offload thread, ...) share glibc's
# main heap instead of one heap each; malloc_trim gives back the free pages inside every heap but
# the top of the main one only, so with one heap the worker's periodic trim (TrimFreedMemory)
# reaches all of its free memory. A worker runs one task thread, so there is little to contend for.
EMBEDDED_DEFAULTS = {
    "distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None,
    "distributed.nanny.pre-spawn-environ.MALLOC_ARENA_MAX": "1",
    "distributed.admin.tick.interval": "1s",
    "distributed.worker.profile.interval": "1s",  # the dashboard's profile still fills
    "distributed.worker.memory.monitor-interval": "500ms",
    "distributed.admin.system-monitor.interval": "2s",
    "distributed.admin.low-level-log-length": 300,  # 5 minutes of profile history
    "distributed.admin.system-monitor.log-length": 300,
    "distributed.diagnostics.computations.max-history": 10,  # one per idle spell (every few s)
}


def embedded_config() -> dict[str, Any]:
    """:data:`EMBEDDED_DEFAULTS`, less every key the user's Dask config has changed from Dask's default."""
    dask_defaults = dask.config.merge(*dask.config.defaults)
    return {key: value for key, value in EMBEDDED_DEFAULTS.items()
            if dask.config.get(key, None) == dask.config.get(key, None, config=dask_defaults)}


def _not_a_dropped_gather(record: logging.LogRecord) -> bool:
    """False for a client's report that it could not gather keys no client here holds any more: the
    training process released the window while it fetched it (a pipeline closed, or an
    interrupt, during the transfer), so no one waits for it and nothing is to be rescheduled."""
    if record.msg != "Couldn't gather %s keys, rescheduling %s" or not isinstance(record.args, tuple):
        return True
    keys = record.args[-1] if record.args else None
    return not isinstance(keys, (list, tuple, set)) or dask_compat.held_by_a_client(keys)


_DISTRIBUTED_LOCK = threading.Lock()
_distributed_ready = False  # use_distributed() ran


def use_distributed() -> None:
    """Import ``distributed`` (~0.4 s of CPU, more under load), give it a generator of its own
    (:func:`~.dask_compat.isolate_jitter`) and run :func:`close_open_runners` at exit before the
    exit handlers ``distributed`` registers on import, and drop its clients' reports of a gather
    of windows released meanwhile; once per process. Every path to a client or
    a cluster calls it first; the embedded cluster's head start does not, so the first batch never
    waits for it (the cluster's start does, on its own thread)."""
    global _distributed_ready
    with _DISTRIBUTED_LOCK:
        if _distributed_ready:
            return
        import distributed  # noqa: F401

        dask_compat.isolate_jitter()
        logging.getLogger("distributed.client").addFilter(_not_a_dropped_gather)
        atexit.unregister(close_open_runners)  # registered again: after Dask's, so it runs before them
        atexit.register(close_open_runners)
        _distributed_ready = True


def local_cluster(n_workers: int | None, threads_per_worker: int = 1, processes: bool = True,
                  dashboard_address: str | None = f"{LOCAL_HOST}:0", timeout: float = DEFAULT_TIMEOUT) -> SpecCluster:
    """The embedded cluster: ``n_workers`` (default: one per core) with quiet logs and
    :func:`embedded_config`. With ``processes``, the scheduler and the workers run in processes
    forked from one host (:mod:`.spawned`, ``timeout`` seconds for the scheduler to start), the
    workers with :data:`WORKER_ENV`, none importing the training script; otherwise a ``LocalCluster`` of threads of
    this process (sharing its env). The scheduler, the workers and the dashboard (``dashboard_address``; ``None``: no dashboard)
    listen on 127.0.0.1 only, unless ``dashboard_address`` names another interface."""
    use_distributed()
    from distributed import LocalCluster

    from .spawned import spawned_cluster

    n = n_workers or os.cpu_count() or 1
    with dask.config.set(embedded_config()):
        if not processes:  # threads talk in-process
            return LocalCluster(n_workers=n, threads_per_worker=threads_per_worker, processes=False,
                                dashboard_address=dashboard_address, silence_logs=logging.ERROR)
        return spawned_cluster(n, threads_per_worker, LOCAL_HOST, dashboard_address, WORKER_ENV, timeout)


def open_client(address: str, timeout: float = DEFAULT_TIMEOUT) -> Client:
    """A client of the scheduler at ``address``: a closed port fails within seconds, a scheduler
    that does not answer within ``timeout`` seconds fails then (both :class:`ClusterError`)."""
    probe_address(address)
    use_distributed()
    from distributed import Client

    try:
        return Client(address, set_as_default=False, timeout=timeout)
    except (OSError, TimeoutError) as exc:
        raise ClusterError(f"could not connect to the Dask scheduler at {address!r} within {timeout:g} s "
                           f"({exc}); check that a scheduler runs there") from None

def embedded_pids(cluster: SpecCluster) -> list[int]:
    """The processes of the embedded ``cluster`` still running: its scheduler's and its host's
    (:mod:`.spawned`) and its workers' (one per nanny)."""
    from .spawned import SchedulerProcess

    scheduler = cluster.scheduler
    pids = scheduler.pids() if isinstance(scheduler, SchedulerProcess) else []
    return pids + [nanny.pid for nanny in list(cluster.workers.values()) if getattr(nanny, "pid", None)]

CLOSE_S = 5.0  # seconds each step of closing a client or a cluster may take


def close_client(client: Client) -> None:
    """Close ``client`` within :data:`CLOSE_S` seconds (best effort: a dead scheduler is left)."""
    try:
        client.close(timeout=CLOSE_S)
    except Exception:  # a client that cannot reach its scheduler any more; nothing to keep
        pass


def close_cluster(cluster: SpecCluster) -> None:
    """Close the embedded ``cluster`` within :data:`CLOSE_S` seconds; past that, kill its
    processes (scheduler and workers), so nothing outlives the runner nor waits at exit."""
    try:
        cluster.close(timeout=CLOSE_S)
        return
    except Exception:  # timed out, or broke half-way
        pass
    dask_compat.leave_to_us_at_exit(cluster)  # Dask's own exit handler would wait for it again
    for pid in embedded_pids(cluster):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    from .spawned import SchedulerProcess

    if isinstance(cluster.scheduler, SchedulerProcess):
        cluster.scheduler.host.stop()  # its socket: a host killed removes nothing


OPEN_RUNNERS: weakref.WeakSet[Runner] = weakref.WeakSet()  # not closed yet


def close_open_runners() -> None:
    """Close every distributed runner still open (each step bounded, see
    :meth:`~.runner.DistributedRunner.close`). Runs at interpreter exit, registered after Dask's own exit
    handlers so that it runs before them, while Dask's event loop still runs: a script that
    ends (or fails) without closing its pipeline exits within seconds, whatever state its
    cluster is in (dead, frozen or still starting)."""
    for runner in list(OPEN_RUNNERS):
        try:
            runner.close()
        except Exception:  # best effort at exit: the next runner still gets closed
            pass
    # imported by every embedded cluster's start (none yet: no attribute, or a start still importing it)
    stop_schedulers = getattr(sys.modules.get(f"{__package__}.spawned"), "stop_schedulers", None)
    if stop_schedulers is not None:
        stop_schedulers()  # of clusters still starting (closed runners' starts, going on in the background)


atexit.register(close_open_runners)
