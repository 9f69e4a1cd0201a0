"""A Dask cluster whose scheduler and workers are forked from one host process; its nannies run here.

With ``LocalCluster`` the scheduler's event loop shares the training process's: every
task update, heartbeat and result relay costs the training process CPU. Here a
``SpecCluster`` runs the scheduler in a process of its own (:class:`SchedulerProcess`, on
127.0.0.1) and the nannies in this process (:class:`QuietNanny`: without the housekeeping only
a nanny's own dashboard would use). The scheduler's process and the worker processes are forked
from the cluster's :class:`~.host.Host`, started first, which imported ``distributed`` and what a
worker needs once (instead of a fresh interpreter importing them for each process, all at once),
and owns their environment: this process's, the worker environment and the nanny's
``pre-spawn-environ`` (:func:`~.dask_compat.worker_environ`), this process's Dask config and
``PYTHONPATH`` (this process's ``sys.path``: the scheduler unpickles the graph). This process's
own environment is never changed, and no process of the cluster imports the training script.
Their stderr is this process's. The scheduler file lives in the temporary directory and is
removed on close.

Lifelines: a worker exits when its nanny is gone (Dask's), the scheduler when this process is
gone (:func:`run_scheduler`), the host when this process and every process forked from it are
gone, or when the scheduler is closed (:meth:`SchedulerProcess.close` closes the host last).

A terminal's Ctrl-C goes to every process of its foreground group; the training process
alone decides what an interrupt means (a checkpoint, then ``close()``). So the host, and every
process forked from it, runs in a session of its own, and the workers ignore SIGINT
(:class:`QuietWorker`). SIGTERM keeps its default in the workers: Python's exit terminates
leftover worker processes with it and then waits for them.

Module state: :data:`RUNNING`, the scheduler processes not closed yet, which
:func:`stop_schedulers` stops at interpreter exit; :data:`STARTING_FROM`, a context variable:
the host of the nanny whose start runs in the current task.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import importlib.util
import json
import logging
import os
import signal
import sys
import tempfile
import threading
import time
import uuid
import weakref
from pathlib import Path

import dask
from distributed import Nanny, Scheduler, SpecCluster, Status, Worker
from distributed.deploy.spec import ProcessInterface

from ..errors import ClusterError
from .dask_compat import (
    INHERIT_CONFIG_ENV,
    QuietRetirement,
    dashboard_on_first_visit,
    no_environ_export,
    processes_from,
    worker_environ,
)
from .host import Host, HostProcess, training_process_gone

SYNC_INTERVAL_S = 10  # the cluster's name and type, for the dashboard, resent every (Dask: 1 s)
CLOSE_WAIT_S = 5.0  # seconds a closing scheduler process (or host) gets before it is killed
# a nanny's periodic callbacks that serve only its own (absent) dashboard and diagnostics; in the
# training process they cost ~1 ms of CPU a second with two nannies (psutil samples of this process)
NANNY_QUIET = ("monitor", "tick", "ticks", "shift_counters")


class QuietNanny(Nanny):
    """A nanny in this process whose worker is forked from ``forked_from`` (when it starts and each time
    it restarts it), without a server's own housekeeping: its system monitor (psutil samples of
    this process, every 2 s, for a dashboard a nanny does not have), its event-loop tick
    measurement and its counters (:data:`NANNY_QUIET`); it exports nothing into this process's
    environment. It still restarts its worker (spawned as Dask does if the host was killed) and
    enforces the worker's memory limit (its memory monitor)."""

    def __init__(self, *args, forked_from: Host, **kwargs):
        super().__init__(*args, **kwargs)
        self.forked_from = forked_from
        no_environ_export(self)
        for name in NANNY_QUIET:
            self.periodic_callbacks.pop(name, None)

    async def instantiate(self):
        if self.forked_from.stopped:  # the cluster closing, or this process exiting: no worker is wanted
            return Status.failed  # (a start then fails, a restart is dropped, and neither logs it)
        # a host gone (killed) leaves Dask's own start: a worker spawned with this process's environment
        context = self.forked_from.context if self.forked_from.running() else None
        token = STARTING_FROM.set(self.forked_from)
        try:
            with processes_from(context):
                return await super().instantiate()
        finally:
            STARTING_FROM.reset(token)


# the host the nanny whose task runs now forks its worker from (set while it starts the worker)
STARTING_FROM: contextvars.ContextVar[Host | None] = contextvars.ContextVar("zephon_starting_from", default=None)
# what a nanny logs when its worker's process could not be started
START_FAILURES = ("Failed to start process", "Nanny failed to start process", "Worker failed to connect")


def _not_a_start_cut_short(record: logging.LogRecord) -> bool:
    """False for a nanny's report that its worker's process could not be started because the
    cluster's host was stopped meanwhile (the cluster closed while it started, or the training
    process exiting): nothing went wrong, the start was called off."""
    if record.msg not in START_FAILURES:
        return True
    host = STARTING_FROM.get()
    return host is None or not host.stopped


def _not_a_dropped_fetch(record: logging.LogRecord) -> bool:
    """False for the worker's report of a result transfer the training process broke off (an
    interrupt while it fetched a window): the window is computed again if it is asked for again."""
    return not str(record.msg).startswith("failed during get data")


def _not_a_dropped_gather(record: logging.LogRecord) -> bool:
    """False for the scheduler's report of a gather whose keys no client holds any more (every one
    ``'forgotten'``): the training process released a window while it fetched it (a pipeline
    closed, or an interrupt, during the transfer), so no one waits for that result."""
    if record.msg != "Couldn't gather keys: %s":
        return True
    states = record.args if isinstance(record.args, dict) else None  # logging unwraps a lone dict argument
    return not states or any(state != "forgotten" for state in states.values())


class QuietWorker(Worker):
    """A worker that ignores SIGINT (a terminal's Ctrl-C is the training process's to handle) and
    does not report a result transfer the training process broke off."""

    def __init__(self, *args, **kwargs):
        if threading.current_thread() is threading.main_thread():  # a worker process's, as its nanny builds it
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            logging.getLogger("distributed.worker").addFilter(_not_a_dropped_fetch)
        super().__init__(*args, **kwargs)


def run_scheduler(options: dict) -> None:
    """The scheduler's process (forked from the host): a ``distributed.Scheduler(**options)``
    until it is closed, asked to stop (SIGTERM) or the training process is gone; a close that
    takes over :data:`CLOSE_WAIT_S` seconds ends the process. It does not report a gather of
    windows the training process released meanwhile. Its dashboard, where bokeh is installed, is
    made on its first visit (:func:`~.dask_compat.dashboard_on_first_visit`)."""
    scheduler_file = Path(options["scheduler_file"])
    options = dict(options)
    on_first_visit = bool(options.get("dashboard")) and importlib.util.find_spec("bokeh") is not None
    if on_first_visit:
        options["dashboard"] = False  # its HTTP server and routes still start, at dashboard_address
    logging.getLogger("distributed.scheduler").addFilter(_not_a_dropped_gather)

    def end() -> None:
        scheduler_file.unlink(missing_ok=True)  # a process forked runs no exit handlers (Dask's removes it)
        os.kill(os.getpid(), signal.SIGKILL)

    async def serve() -> None:
        scheduler = await Scheduler(**options)
        if on_first_visit:
            dashboard_on_first_visit(scheduler)  # the CPU it costs, paid only if looked at
        loop = asyncio.get_running_loop()
        gone = training_process_gone()
        closing: list[asyncio.Task] = []

        def stop(reason: str) -> None:
            if gone is not None:
                loop.remove_reader(gone)
            if not closing:  # a scheduler closing already (its client asked) is only given a deadline
                if scheduler.status.name not in ("closing", "closed"):
                    closing.append(asyncio.ensure_future(scheduler.close(reason=reason)))
                loop.call_later(CLOSE_WAIT_S, end)

        loop.add_signal_handler(signal.SIGTERM, stop, "asked to stop")
        if gone is not None:
            loop.add_reader(gone, stop, "the process that started the scheduler is gone")
        await scheduler.finished()
        # the loop still runs while asyncio.run winds down: a SIGTERM now (the client's close, which
        # closed the scheduler, sends one next) must not start a close the ending loop never runs
        loop.remove_signal_handler(signal.SIGTERM)
        if gone is not None:
            loop.remove_reader(gone)
        signal.signal(signal.SIGTERM, lambda *_: end())

    try:
        asyncio.run(serve())
    finally:
        scheduler_file.unlink(missing_ok=True)


class SchedulerProcess(ProcessInterface):
    """The scheduler's process, forked from ``host`` (:func:`run_scheduler`); its address is read
    from the scheduler file it writes. Holds the process, and closes the host after it."""

    def __init__(self, options: dict, host: Host, timeout: float):
        self.options, self.host, self.timeout = options, host, timeout
        self.process: HostProcess | None = None  # once started
        super().__init__()

    async def start(self) -> None:
        self.process = process = self.host.context.Process(target=run_scheduler, args=(self.options,),
                                                           name="zephon-dask scheduler", daemon=True)
        RUNNING.add(self)
        path, deadline = Path(self.options["scheduler_file"]), time.monotonic() + self.timeout
        try:  # the host forks it once its imports are done
            await asyncio.wait_for(asyncio.to_thread(process.start), self.timeout)
        except (OSError, EOFError, TimeoutError):
            pass  # reported below, as a scheduler that did not start
        while self.address is None:
            with contextlib.suppress(OSError, ValueError):  # not written yet, or half-written
                self.address = json.loads(path.read_text())["address"]
            if self.address is None:
                if self.live_pid() is None or time.monotonic() > deadline:
                    await self.close()
                    raise ClusterError(f"the embedded cluster's scheduler did not start within {self.timeout:g} s "
                                       "(its errors are above, on stderr); raise cluster_timeout on a slow machine")
                await asyncio.sleep(0.05)
        await super().start()

    def live_pid(self) -> int | None:
        """The scheduler process's pid while it runs, else ``None``."""
        process = self.process
        return process.pid if process is not None and process.pid is not None and process.is_alive() else None

    def pids(self) -> list[int]:
        """The scheduler's and the host's processes, those still running."""
        pid = self.live_pid()
        return ([pid] if pid is not None else []) + ([self.host.pid] if self.host.running() else [])

    async def close(self) -> None:
        RUNNING.discard(self)
        process, self.process = self.process, None
        if process is not None and process.pid is not None:
            process.terminate()  # run_scheduler closes its scheduler on SIGTERM
            await asyncio.to_thread(process.join, CLOSE_WAIT_S)
            if process.exitcode is None:
                process.kill()
                await asyncio.to_thread(process.join, CLOSE_WAIT_S)
        await asyncio.to_thread(self.host.close, CLOSE_WAIT_S)
        Path(self.options["scheduler_file"]).unlink(missing_ok=True)
        await super().close()


class EmbeddedCluster(QuietRetirement, SpecCluster):
    """A ``SpecCluster`` whose processes are forked from ``forked_from``. Once that host is stopped
    (the cluster closed, or this process exiting while the cluster still starts), its scheduler
    may be gone before Dask's own close retires the workers: that is called off quietly
    (:class:`~.dask_compat.QuietRetirement`)."""

    def __init__(self, *args, forked_from: Host, **kwargs):
        self.forked_from = forked_from
        super().__init__(*args, **kwargs)

    def retirement_called_off(self) -> bool:
        return self.forked_from.stopped


RUNNING: weakref.WeakSet[SchedulerProcess] = weakref.WeakSet()  # started and not closed


def stop_schedulers() -> None:
    """Ask every scheduler process started here and not closed, and its host, to stop
    (``SIGTERM``), waiting for none: at interpreter exit, a cluster still starting is not waited
    for, and its processes neither outlive this process nor hold its stderr."""
    for scheduler in list(RUNNING):
        pid = scheduler.live_pid()
        if pid is not None:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
        scheduler.host.stop()


def spawned_cluster(n_workers: int, threads_per_worker: int, host: str, dashboard_address: str | None,
                    worker_env: dict[str, str], timeout: float,
                    silence_logs: int = logging.ERROR) -> EmbeddedCluster:
    """Start the host, then the scheduler's process (listening on ``host``, dashboard at
    ``dashboard_address``, or none; ``timeout`` seconds to start) and ``n_workers`` nannies here,
    each with one worker process of ``threads_per_worker`` threads, environment ``worker_env``
    and an equal share of the machine's memory. Logs below ``silence_logs`` are dropped, here and
    in the cluster's processes."""
    config = dask.config.merge(dask.config.global_config,
                               {"logging": {"distributed": logging.getLevelName(silence_logs).lower()}})
    # this process's sys.path, as multiprocessing gives the workers: the scheduler unpickles the
    # graph, so it imports what the tasks refer to (a module beside the training script included)
    path = os.pathsep.join(p or os.getcwd() for p in sys.path)
    env = {**os.environ, **worker_environ(worker_env), INHERIT_CONFIG_ENV: dask.config.serialize(config),
           "PYTHONPATH": path}
    options = {"host": host, "port": 0, "dashboard": dashboard_address is not None,
               # no dashboard still serves Dask's health routes: on a free port, not on 8787 (taken
               # by another cluster, that would print a warning)
               "dashboard_address": dashboard_address if dashboard_address is not None else f"{host}:0",
               "scheduler_file": os.path.join(tempfile.gettempdir(), f"zephon-dask-scheduler-{uuid.uuid4().hex}.json")}
    logging.getLogger("distributed.nanny").addFilter(_not_a_start_cut_short)  # once: the same function
    the_host = Host(env)
    scheduler = {"cls": SchedulerProcess, "options": {"options": options, "host": the_host, "timeout": timeout}}
    worker = {"cls": QuietNanny, "options": {"nthreads": threads_per_worker, "host": host, "env": worker_env,
                                         "worker_class": QuietWorker, "memory_limit": 1 / n_workers,
                                         "dashboard": False, "silence_logs": silence_logs,
                                         "forked_from": the_host}}
    # shutdown_on_close=False: Dask's exit handler would wait up to 10 s for a cluster still starting
    # (and join its event loop); the runner closes its cluster at exit itself, and the processes of
    # one still starting end with this process (the lifelines)
    try:
        return EmbeddedCluster(workers={i: worker for i in range(n_workers)}, scheduler=scheduler, worker=worker,
                               silence_logs=silence_logs, name="embedded", scheduler_sync_interval=SYNC_INTERVAL_S,
                               shutdown_on_close=False, forked_from=the_host)
    except BaseException:
        the_host.close(CLOSE_WAIT_S)
        raise
