"""Real Dask clusters as processes, for tests and benchmarks: ``dask scheduler`` and ``dask worker``
(no nannies) on 127.0.0.1. Module state: none."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def dask_cluster(workdir: Path, n_workers: int, limit: float = 60.0) -> Iterator[tuple[str, subprocess.Popen, list]]:
    """``(address, scheduler process, worker processes)``, the scheduler file in ``workdir``; each
    start waits at most ``limit`` seconds. All are stopped on exit (and woken first, should a test
    have frozen one with SIGSTOP)."""
    dask = str(Path(sys.executable).parent / "dask")
    sched_file = Path(workdir) / "scheduler.json"
    sched_file.unlink(missing_ok=True)
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    procs = [subprocess.Popen([dask, "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                               "--scheduler-file", str(sched_file)], **quiet)]
    try:
        deadline = time.monotonic() + limit
        while not (sched_file.exists() and sched_file.stat().st_size):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the scheduler did not start within {limit:g} s")
            time.sleep(0.1)
        address = json.loads(sched_file.read_text())["address"]
        procs += [subprocess.Popen([dask, "worker", address, "--nthreads", "1", "--no-nanny", "--no-dashboard",
                                    "--host", "127.0.0.1", "--death-timeout", "20"], **quiet)
                  for _ in range(n_workers)]
        from distributed import Client

        with Client(address, set_as_default=False, timeout=30) as client:
            client.wait_for_workers(n_workers, timeout=limit)
        yield address, procs[0], procs[1:]
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGCONT)
                p.kill()
        for p in procs:
            p.wait(timeout=30)
