"""The embedded cluster's scheduler runs in a process of its own (execution/spawned.py): it gets
the embedded settings and the user's Dask config, writes to this process's stderr, and neither
it, its workers, their host nor its scheduler file outlive the training process, closed or killed (that it
listens on 127.0.0.1 only: test_faults_cluster.py); the nannies here skip their own housekeeping."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

import zephon_dask as z
from tests.helpers.pipelines import build, child_pids, wait_for, wait_until_no_new_processes

pytestmark = pytest.mark.timeout(120)

KILLED_SCRIPT = """
import json, sys
sys.path.insert(0, {root!r})
from pathlib import Path
from tests.helpers.pipelines import build

p = build(Path({corpus!r}), runner="distributed", n_workers=1)
next(iter(p))
runner = p.session.runner()
pid, host, scheduler_file = runner.client.run_on_scheduler(
    lambda dask_scheduler: (__import__("os").getpid(), __import__("os").getppid(), dask_scheduler.scheduler_file))
print(json.dumps({{"pids": [host, pid, *runner.worker_pids().values()], "scheduler_file": scheduler_file,
                  "host_directory": runner._cluster.scheduler.host.directory}}), flush=True)
sys.stdin.read()  # until killed
"""


# a lambda travels by value: the scheduler's process cannot import this test module
_scheduler_settings = lambda dask_scheduler: (  # noqa: E731
    os.getpid(), dask_scheduler.scheduler_file, __import__("dask").config.get("distributed.admin.tick.interval"),
    __import__("dask").config.get("distributed.scheduler.worker-saturation"))


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # exited; not reaped by its new parent
    except psutil.NoSuchProcess:
        return True


def test_scheduler_runs_apart_with_the_embedded_settings_and_the_users_config(corpus_dir):
    import dask
    import distributed  # noqa: F401  (its config must exist before dask.config.set records what to restore)

    before = child_pids()
    with dask.config.set({"distributed.scheduler.worker-saturation": 2.5}), build(corpus_dir, n_workers=1) as p:
        next(iter(p))
        pid, scheduler_file, tick, saturation = p.session.runner().client.run_on_scheduler(_scheduler_settings)
        assert Path(scheduler_file).exists()
    assert pid != os.getpid() and pid in before | {pid}
    assert (tick, saturation) == ("1s", 2.5)
    assert not Path(scheduler_file).exists()
    wait_until_no_new_processes(before)  # scheduler and worker processes all ended


def test_killed_training_process_leaves_no_process_nor_scheduler_file(corpus_dir, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(KILLED_SCRIPT.format(root=str(Path(__file__).resolve().parents[2]), corpus=str(corpus_dir)))
    proc = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        started = json.loads(proc.stdout.readline())
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    pids, scheduler_file, host = started["pids"], Path(started["scheduler_file"]), Path(started["host_directory"])
    assert host.parent == Path(tempfile.gettempdir()) and host.name.startswith("zephon-dask-host-")
    assert len(set(pids)) == 3 and os.getpid() not in pids  # the host, the scheduler and the worker
    wait_for(lambda: all(map(_gone, pids)), 30, every=0.2)
    assert all(map(_gone, pids)), [p for p in pids if not _gone(p)]
    assert not scheduler_file.exists()
    assert not host.exists()  # nor the host's socket (other runs' hosts may come and go meanwhile)


# by value, as above; 3,000 lines of ~160 bytes: far more than a pipe holds, were stderr one
_shout = lambda: [__import__("logging").getLogger("distributed.scheduler").error("zephon-test %s %d", "x" * 100, i)  # noqa: E731
                  for i in range(3000)] and "said"


def test_the_schedulers_log_reaches_this_process_and_never_blocks_it(capfd):
    from distributed import Client

    from zephon_dask.execution.cluster import local_cluster

    pool = ThreadPoolExecutor(1)  # a blocked scheduler would block run_on_scheduler for good
    try:
        with local_cluster(1, dashboard_address=None) as cluster, Client(cluster, set_as_default=False) as client:
            assert pool.submit(client.run_on_scheduler, _shout).result(timeout=30) == "said"
            assert client.submit(sum, [1, 2], pure=False).result(timeout=30) == 3
            # the nanny here keeps only what guards its worker (the memory limit), not its own housekeeping
            nanny, = cluster.workers.values()
            assert "memory_monitor" in nanny.periodic_callbacks
            assert not {"monitor", "tick", "ticks", "shift_counters"} & set(nanny.periodic_callbacks)
    finally:
        pool.shutdown(wait=False)
    assert capfd.readouterr().err.count("zephon-test") == 3000


LATE_SIGTERM_SCRIPT = """
import asyncio, os, signal, sys
sys.path.insert(0, {root!r})
from distributed import Scheduler
from zephon_dask.execution.spawned import run_scheduler

close, finished = Scheduler.close, Scheduler.finished


async def reported_close(self, *args, **kwargs):
    print("close started", file=sys.stderr, flush=True)
    return await close(self, *args, **kwargs)


async def finished_then_sigterm(self):
    await finished(self)
    os.kill(os.getpid(), signal.SIGTERM)  # what SchedulerProcess.close sends after the client's close
    await asyncio.sleep(0.2)


Scheduler.close, Scheduler.finished = reported_close, finished_then_sigterm
run_scheduler({{"host": "127.0.0.1", "port": 0, "dashboard": False, "scheduler_file": {file!r}}})
"""


def test_a_sigterm_after_the_clients_close_starts_no_second_close(tmp_path):
    """The client's close closes the scheduler; SIGTERM (from :class:`SchedulerProcess`'s close)
    then reaches its process: it starts no second close, which the loop, winding down, might
    never run ("Task was destroyed but it is pending", "coroutine 'Scheduler.close' was never
    awaited" at exit, once in about eight closes of the embedded cluster)."""
    from distributed import Client

    file = tmp_path / "scheduler.json"
    script = tmp_path / "scheduler.py"
    script.write_text(LATE_SIGTERM_SCRIPT.format(root=str(Path(__file__).resolve().parents[2]), file=str(file)))
    proc = subprocess.Popen([sys.executable, str(script)], stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: file.exists() and file.stat().st_size > 0 or proc.poll() is not None, 60)
        with Client(scheduler_file=str(file), set_as_default=False, timeout=30) as client:
            client.shutdown()
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert err.count("close started") == 1, err
    assert not any(noise in err for noise in ("Task was destroyed", "never awaited", "wakeup fd")), err
    assert not file.exists()


CLOSING_LOOP_SIGTERM_SCRIPT = """
import asyncio, os, signal, sys, time
sys.path.insert(0, {root!r})
from asyncio import selector_events
from distributed import Scheduler
from zephon_dask.execution.spawned import run_scheduler

close_pipe, finished = selector_events.BaseSelectorEventLoop._close_self_pipe, Scheduler.finished


def close_pipe_then_sigterm(self):  # a SIGTERM just as asyncio.run closes the scheduler's loop
    close_pipe(self)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.2)


async def closed_at_once(self):
    await self.close()
    await finished(self)


selector_events.BaseSelectorEventLoop._close_self_pipe = close_pipe_then_sigterm
Scheduler.finished = closed_at_once
run_scheduler({{"host": "127.0.0.1", "port": 0, "dashboard": False, "scheduler_file": {file!r}}})
"""


def test_a_sigterm_while_the_schedulers_loop_closes_is_quiet(tmp_path):
    """A SIGTERM that reaches the scheduler's process once its event loop has closed its self-pipe,
    before the loop's close resets the signal wakeup fd: "Exception ignored when trying to write
    to the signal wakeup fd: OSError: [Errno 9]" while the loop's handler stayed installed."""
    file, script = tmp_path / "scheduler.json", tmp_path / "scheduler.py"
    script.write_text(CLOSING_LOOP_SIGTERM_SCRIPT.format(root=str(Path(__file__).resolve().parents[2]), file=str(file)))
    proc = subprocess.run([sys.executable, str(script)], stderr=subprocess.PIPE, text=True, timeout=60)
    assert not any(noise in proc.stderr for noise in ("Exception ignored", "wakeup fd", "Traceback")), proc.stderr
    assert not file.exists()


def test_a_module_only_this_process_can_import_reaches_the_scheduler(corpus_dir, tmp_path, monkeypatch):
    # the scheduler unpickles the graph: a function from a module beside the training script
    # (on sys.path here, not in the scheduler's working directory) must import there too
    (tmp_path / "beside_the_script.py").write_text("def keep(rows):\n    return rows\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    beside = __import__("beside_the_script")
    web = z.Dataset.from_jsonl("web", str(corpus_dir / "web"), progress=False)
    p = (z.Pipeline(z.MixtureWorkSource([web], chunk_size=12, seed=1)).map(beside.keep).tokenize().pack(96).batch(3)
         .options(canonical_replicas=2, flush_every_k_chunks=2, n_workers=1, head_start=False))
    with p:
        assert len(next(iter(p))["tokens"]) == 3


HOLD_S = 0.5  # seconds a gather waits on the scheduler at most, unless its keys are forgotten sooner


def test_pipelines_closed_while_a_window_is_fetched_close_quietly(corpus_dir, capfd, caplog):
    """Pipelines sharing one embedded cluster, each closed after its first batch while the
    scheduler gathers a window fetched ahead: the window is released during the transfer, which
    the scheduler then fails to finish ("Couldn't gather keys: {...: 'forgotten'}" at ERROR
    there, "Couldn't gather 1 keys, rescheduling" at WARNING here, before). Each gather is held on the scheduler until its keys are forgotten (at most
    :data:`HOLD_S` seconds), so the release lands during it; nothing is logged."""
    from distributed import Client

    from zephon_dask.execution.cluster import local_cluster

    def hold_gathers(dask_scheduler, hold=HOLD_S):  # nested: it travels by value
        import asyncio
        import time

        gather, counts = dask_scheduler.handlers["gather"], {"started": 0, "ended": 0}

        async def held(keys, **kwargs):
            counts["started"] += 1
            try:
                until = time.monotonic() + hold
                while any(k in dask_scheduler.tasks for k in keys) and time.monotonic() < until:
                    await asyncio.sleep(0.01)
                return await gather(keys=keys, **kwargs)
            finally:
                counts["ended"] += 1

        dask_scheduler.handlers["gather"], dask_scheduler.zephon_test_gathers = held, counts

    def gathers(dask_scheduler):
        return dict(dask_scheduler.zephon_test_gathers)

    with local_cluster(1, dashboard_address=None) as cluster, Client(cluster, set_as_default=False) as client:
        client.run_on_scheduler(hold_gathers)

        def under_way() -> bool:
            counts = client.run_on_scheduler(gathers)
            return counts["started"] > counts["ended"]

        for seed in (41, 42, 43):  # fingerprints of their own: no key is shared
            p = build(corpus_dir, seed=seed, client=client, prefetch_windows=4)
            next(iter(p))
            assert wait_for(under_way, 60, every=0.02), "no window was being fetched"
            p.close()
            assert wait_for(lambda: not under_way(), 60, every=0.05)  # its report (if any) is written
    err = capfd.readouterr().err  # the scheduler's and the workers' stderr too
    assert not [line for line in err.splitlines()
                if any(noise in line for noise in ("ERROR", "WARNING", "Warning", "Exception ignored", "Traceback"))], err
    # this process's Dask logs (its handler is at ERROR while the embedded cluster runs)
    assert not [r for r in caplog.records if r.name.startswith("distributed") and r.levelno >= logging.WARNING]
