"""Real Dask clusters as processes, for tests and benchmarks: ``dask scheduler`` and ``dask worker``
(no nannies) on 127.0.0.1. Module state: none."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path


def unused_port() -> int:
    """A TCP port free on 127.0.0.1 below Linux's ephemeral range (32768-60999), so no outgoing
    connection takes it while a scheduler restarted on it is down."""
    rng = random.Random(os.getpid())
    for _ in range(200):
        port = rng.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise OSError("no free port between 20000 and 32000")


def start_dask(workdir: Path, n_workers: int, port: int = 0, limit: float = 60.0) -> tuple[str, list[subprocess.Popen]]:
    """``(address, [scheduler, *workers])``: ``dask scheduler`` on 127.0.0.1:``port`` (0: any), its
    scheduler file in ``workdir``, and ``n_workers`` workers, once they are connected (each start
    waits at most ``limit`` seconds). Stopped here if the start fails; else stop them with
    :func:`stop_dask`."""
    dask = str(Path(sys.executable).parent / "dask")
    sched_file = Path(workdir) / "scheduler.json"
    sched_file.unlink(missing_ok=True)
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    procs = [subprocess.Popen([dask, "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard",
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
    except BaseException:
        stop_dask(procs)
        raise
    return address, procs


def stop_dask(procs: list[subprocess.Popen]) -> None:
    """Kill ``procs`` (woken first, should a test have frozen one with SIGSTOP) and reap them."""
    for p in procs:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, signal.SIGCONT)
            p.kill()
    for p in procs:
        p.wait(timeout=30)


@contextlib.contextmanager
def dask_cluster(workdir: Path, n_workers: int, limit: float = 60.0,
                 port: int = 0) -> Iterator[tuple[str, subprocess.Popen, list]]:
    """``(address, scheduler process, worker processes)`` (:func:`start_dask`); all are stopped on
    exit."""
    address, procs = start_dask(workdir, n_workers, port, limit)
    try:
        yield address, procs[0], procs[1:]
    finally:
        stop_dask(procs)
