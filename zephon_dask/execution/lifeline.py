"""A Dask scheduler preload: the scheduler closes once the process that started it is gone.

The embedded cluster's scheduler runs in a process of its own (see :mod:`.spawned`); if
the training process is killed, nothing closes that scheduler, so it checks every
:data:`CHECK_S` seconds whether its parent is still the process named by
:data:`PARENT_ENV` (a killed parent's children are handed to another process) and
closes when not: its process then exits, and the scheduler file it wrote goes with
it. The workers end with their nannies, which live in the training process.
Loaded by file path in the scheduler's process: it imports only the standard library.
"""

from __future__ import annotations

import asyncio
import os

PARENT_ENV = "ZEPHON_DASK_PARENT_PID"
CHECK_S = 1.0
_WATCHES: set[asyncio.Task] = set()  # the running watch, referenced until it ends


def dask_setup(scheduler) -> None:
    """Start watching this process's parent (Dask calls this once the scheduler has started)."""
    parent = int(os.environ.get(PARENT_ENV) or os.getppid())

    async def watch() -> None:
        while os.getppid() == parent:
            await asyncio.sleep(CHECK_S)
        await scheduler.close(reason="the process that started the scheduler is gone")

    task = asyncio.ensure_future(watch())
    _WATCHES.add(task)
    task.add_done_callback(_WATCHES.discard)
