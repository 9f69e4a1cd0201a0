"""A Dask cluster whose scheduler runs in a process of its own; its nannies run here.

With ``LocalCluster`` the scheduler's event loop shares the training process's: every
task update, heartbeat and result relay costs the training process CPU. Here
``SpecCluster`` starts the scheduler as ``distributed``'s ``SubprocessScheduler`` (a
``dask spec`` process on 127.0.0.1) and the nannies in this process, which spawn the
worker processes as ``LocalCluster``'s do (so the caller's environment and
``__main__`` handling apply to them). The scheduler process gets this process's Dask
config and the :mod:`.lifeline` preload (it closes when this process is gone; a
killed training process leaves no process behind: the workers exit with their
nanny). The scheduler file lives in the temporary directory and is removed on close.
Holds no state of its own beyond the cluster it returns.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import tempfile
import uuid
from pathlib import Path
from typing import cast

import dask
from distributed import Nanny, SpecCluster
from distributed.deploy.subprocess import SubprocessScheduler

from . import lifeline

INHERIT_ENV = "DASK_INTERNAL_INHERIT_CONFIG"  # read by dask.config when the scheduler process starts
SYNC_INTERVAL_S = 10  # the cluster's name and type, for the dashboard, resent every (Dask: 1 s)


class SpawnedCluster(SpecCluster):
    """``SpecCluster`` with its scheduler in a subprocess. Copies what the scheduler writes to its
    stderr (a pipe: left unread, a scheduler that logged over ~200 KB would block) to this
    process's stderr; removes the scheduler file on close."""

    def __init__(self, *args, scheduler_file: str, **kwargs):
        self.scheduler_file = scheduler_file
        self._relay: asyncio.Task | None = None
        super().__init__(*args, **kwargs)

    async def _start(self):
        await super()._start()
        process = cast(SubprocessScheduler, self.scheduler).process
        assert process is not None and process.stderr is not None, "a started scheduler has its stderr pipe"
        self._relay = asyncio.ensure_future(_relay(process.stderr))

    async def _close(self):
        if self._relay is not None:  # before the scheduler's own close reads the pipe to its end
            self._relay.cancel()
        try:
            await super()._close()
        finally:
            Path(self.scheduler_file).unlink(missing_ok=True)


async def _relay(stream: asyncio.StreamReader) -> None:
    while line := await stream.readline():
        sys.stderr.write(line.decode(errors="replace"))


def spawned_cluster(n_workers: int, threads_per_worker: int, host: str, dashboard_address: str | None,
                    worker_env: dict[str, str], silence_logs: int = logging.ERROR) -> SpawnedCluster:
    """Start the scheduler process (listening on ``host``, dashboard at ``dashboard_address``, or
    none) and ``n_workers`` nannies here, each with one worker process of ``threads_per_worker``
    threads, environment ``worker_env`` and an equal share of the machine's memory. Sets
    :data:`INHERIT_ENV` and :data:`.lifeline.PARENT_ENV` in ``os.environ`` for the scheduler
    process: the caller restores the environment."""
    config = dask.config.merge(dask.config.global_config,
                               {"logging": {"distributed": logging.getLevelName(silence_logs).lower()}})
    os.environ[INHERIT_ENV] = dask.config.serialize(config)
    os.environ[lifeline.PARENT_ENV] = str(os.getpid())
    scheduler_file = os.path.join(tempfile.gettempdir(), f"zephon-dask-scheduler-{uuid.uuid4().hex}.json")
    scheduler = {"cls": SubprocessScheduler, "options": {"scheduler_kwargs": {
        "host": host, "port": 0, "dashboard": dashboard_address is not None,
        "dashboard_address": dashboard_address, "scheduler_file": scheduler_file,
        "preload": [lifeline.__file__]}}}
    worker = {"cls": Nanny, "options": {"nthreads": threads_per_worker, "host": host, "env": worker_env,
                                         "memory_limit": 1 / n_workers, "dashboard": False,
                                         "silence_logs": silence_logs}}
    return SpawnedCluster(workers={i: worker for i in range(n_workers)}, scheduler=scheduler, worker=worker,
                          silence_logs=silence_logs, name="embedded", scheduler_sync_interval=SYNC_INTERVAL_S,
                          scheduler_file=scheduler_file)
