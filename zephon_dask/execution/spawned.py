"""A Dask cluster whose scheduler runs in a process of its own; its nannies run here.

With ``LocalCluster`` the scheduler's event loop shares the training process's: every
task update, heartbeat and result relay costs the training process CPU. Here a
``SpecCluster`` starts the scheduler with Dask's own ``dask spec`` command
(:class:`SchedulerProcess`, on 127.0.0.1) and the nannies in this process (:class:`QuietNanny`:
without the housekeeping only a nanny's own dashboard would use), which
spawn the worker processes as ``LocalCluster``'s do (so the caller's environment
and ``__main__`` handling apply to them). The scheduler process gets this
process's Dask config and the :mod:`.lifeline` preload (it closes when this
process is gone; the workers exit with their nanny), through an environment of
its own (this process's is never changed; its ``PYTHONPATH`` is this process's
``sys.path``). Its stderr is this process's. Its
scheduler file lives in the temporary directory and is removed on close.

A terminal's Ctrl-C goes to every process of its foreground group; the training process
alone decides what an interrupt means (a checkpoint, then ``close()``). So the scheduler
runs in a session of its own and the workers ignore SIGINT (:class:`QuietWorker`, from the
moment the worker is built: a worker process still importing its libraries takes it).
SIGTERM keeps its default in the workers: Python's exit terminates leftover worker
processes with it and then waits for them.

Module state: :data:`RUNNING`, the scheduler processes not closed yet, which
:func:`stop_schedulers` stops at interpreter exit.
"""

from __future__ import annotations

import asyncio
import contextlib
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
from distributed import Nanny, SpecCluster, Worker
from distributed.deploy.spec import ProcessInterface

from ..errors import ClusterError
from . import lifeline
from .dask_compat import INHERIT_CONFIG_ENV

SYNC_INTERVAL_S = 10  # the cluster's name and type, for the dashboard, resent every (Dask: 1 s)
CLOSE_WAIT_S = 5.0  # seconds a closing scheduler process gets before it is killed
# a nanny's periodic callbacks that serve only its own (absent) dashboard and diagnostics; in the
# training process they cost ~1 ms of CPU a second with two nannies (psutil samples of this process)
NANNY_QUIET = ("monitor", "tick", "ticks", "shift_counters")


class QuietNanny(Nanny):
    """A nanny in this process without a server's own housekeeping: its system monitor
    (psutil samples of this process, every 2 s, for a dashboard a nanny does not have), its
    event-loop tick measurement and its counters (:data:`NANNY_QUIET`). It still restarts its
    worker and enforces the worker's memory limit (its memory monitor)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for name in NANNY_QUIET:
            self.periodic_callbacks.pop(name, None)


def _not_a_dropped_fetch(record: logging.LogRecord) -> bool:
    """False for the worker's report of a result transfer the training process broke off (an
    interrupt while it fetched a window): the window is computed again if it is asked for again."""
    return not str(record.msg).startswith("failed during get data")


class QuietWorker(Worker):
    """A worker that ignores SIGINT (a terminal's Ctrl-C is the training process's to handle) and
    does not report a result transfer the training process broke off."""

    def __init__(self, *args, **kwargs):
        if threading.current_thread() is threading.main_thread():  # a worker process's, as its nanny builds it
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            logging.getLogger("distributed.worker").addFilter(_not_a_dropped_fetch)
        super().__init__(*args, **kwargs)


class SchedulerProcess(ProcessInterface):
    """``python -m dask spec`` running a ``distributed.Scheduler(**options)`` with environment
    ``env``; its address is read from the scheduler file it writes. Holds the process."""

    def __init__(self, options: dict, env: dict[str, str], timeout: float):
        self.options, self.env, self.timeout = options, env, timeout
        self.process: asyncio.subprocess.Process | None = None
        super().__init__()

    async def start(self) -> None:
        spec = json.dumps({"cls": "distributed.Scheduler", "opts": self.options})
        self.process = await asyncio.create_subprocess_exec(sys.executable, "-m", "dask", "spec", "--spec", spec,
                                                            env=self.env, start_new_session=True)
        RUNNING.add(self)
        path, deadline = Path(self.options["scheduler_file"]), time.monotonic() + self.timeout
        while self.address is None:
            with contextlib.suppress(OSError, ValueError):  # not written yet, or half-written
                self.address = json.loads(path.read_text())["address"]
            if self.address is None:
                if self.process.returncode is not None or time.monotonic() > deadline:
                    await self.close()
                    raise ClusterError(f"the embedded cluster's scheduler did not start within {self.timeout:g} s "
                                       "(its errors are above, on stderr); raise cluster_timeout on a slow machine")
                await asyncio.sleep(0.05)
        await super().start()

    async def close(self) -> None:
        RUNNING.discard(self)
        process, self.process = self.process, None
        if process is not None and process.returncode is None:
            process.terminate()  # dask spec closes its scheduler on SIGTERM
            try:
                await asyncio.wait_for(process.wait(), CLOSE_WAIT_S)
            except TimeoutError:
                process.kill()
                await process.wait()
        Path(self.options["scheduler_file"]).unlink(missing_ok=True)
        await super().close()


RUNNING: weakref.WeakSet[SchedulerProcess] = weakref.WeakSet()  # started and not closed


def stop_schedulers() -> None:
    """Ask every scheduler process started here and not closed to stop (``SIGTERM``; one still
    starting ends at once), waiting for none: at interpreter exit, a cluster still starting is
    not waited for, and its scheduler neither outlives this process nor holds its stderr."""
    for scheduler in list(RUNNING):
        process = scheduler.process
        if process is not None and process.returncode is None:
            with contextlib.suppress(OSError):
                os.kill(process.pid, signal.SIGTERM)


def spawned_cluster(n_workers: int, threads_per_worker: int, host: str, dashboard_address: str | None,
                    worker_env: dict[str, str], timeout: float,
                    silence_logs: int = logging.ERROR) -> SpecCluster:
    """Start the scheduler process (listening on ``host``, dashboard at ``dashboard_address``, or
    none; ``timeout`` seconds to start) and ``n_workers`` nannies here, each with one worker
    process of ``threads_per_worker`` threads, environment ``worker_env`` and an equal share of the
    machine's memory. Logs below ``silence_logs`` are dropped, here and in the scheduler."""
    config = dask.config.merge(dask.config.global_config,
                               {"logging": {"distributed": logging.getLevelName(silence_logs).lower()}})
    # this process's sys.path, as multiprocessing gives the workers: the scheduler unpickles the
    # graph, so it imports what the tasks refer to (a module beside the training script included)
    path = os.pathsep.join(p or os.getcwd() for p in sys.path)
    env = {**os.environ, INHERIT_CONFIG_ENV: dask.config.serialize(config), lifeline.PARENT_ENV: str(os.getpid()),
           "PYTHONPATH": path}
    options = {"host": host, "port": 0, "dashboard": dashboard_address is not None,
               "dashboard_address": dashboard_address, "preload": [lifeline.__file__],
               "scheduler_file": os.path.join(tempfile.gettempdir(), f"zephon-dask-scheduler-{uuid.uuid4().hex}.json")}
    scheduler = {"cls": SchedulerProcess, "options": {"options": options, "env": env, "timeout": timeout}}
    worker = {"cls": QuietNanny, "options": {"nthreads": threads_per_worker, "host": host, "env": worker_env,
                                         "worker_class": QuietWorker,
                                         "memory_limit": 1 / n_workers, "dashboard": False,
                                         "silence_logs": silence_logs}}
    # shutdown_on_close=False: Dask's exit handler would wait up to 10 s for a cluster still starting
    # (and join its event loop); the runner closes its cluster at exit itself, and the processes of
    # one still starting end with this process (the lifeline, the nannies' pipes)
    return SpecCluster(workers={i: worker for i in range(n_workers)}, scheduler=scheduler, worker=worker,
                       silence_logs=silence_logs, name="embedded", scheduler_sync_interval=SYNC_INTERVAL_S,
                       shutdown_on_close=False)
