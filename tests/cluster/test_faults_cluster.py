"""Fault matrix, cluster part: real ``dask scheduler`` and ``dask worker`` processes on 127.0.0.1.

Every case sets a short ``cluster_timeout`` or ``stall_timeout`` and a pytest timeout,
so a wait without a deadline fails the test instead of hanging the run.
"""

from __future__ import annotations

import logging
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.clusters import dask_cluster, start_dask, stop_dask, unused_port
from tests.helpers.oracles import batch_rows, ref_group_stream
from tests.helpers.pipelines import build
from zephon_dask.errors import ClusterError, ClusterStallError, ConfigError, ZephonError
from zephon_dask.pipeline.ranks import owned_lanes

pytestmark = pytest.mark.timeout(120)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(predicate, what: str, limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {limit} s waiting for {what}")
        time.sleep(0.1)


def reference(pipeline):
    return ref_group_stream(pipeline.spec, owned_lanes(pipeline.description.settings), pipeline.description.batch.microbatch_size)


def _consume_after(pipeline, fault) -> tuple[list, BaseException | None]:
    """Batches read; ``fault()`` runs after the first one; ``(rows, error)``."""
    rows: list = []
    try:
        for b in pipeline:
            rows.append(batch_rows(b))
            if len(rows) == 1:
                fault()
    except ZephonError as exc:
        return rows, exc
    return rows, None


def test_closed_port_fails_within_seconds_naming_the_address(corpus_dir):
    import dask
    import distributed  # noqa: F401  (imported here, its config defaults outlive dask.config.set below)

    address = f"tcp://127.0.0.1:{_free_port()}"
    p = build(corpus_dir, address=address)
    # distributed alone would retry for an hour: the pipeline's own connect deadline ends it
    with dask.config.set({"distributed.comm.timeouts.connect": "3600s"}), \
            pytest.raises(ClusterError, match=address) as info, p:
        next(iter(p))
    assert isinstance(info.value, ConnectionError)


def test_timeout_options_are_checked():
    from zephon_dask.validate import check_seconds

    for bad in (0, -1, "5", True, float("nan"), 10**9):
        with pytest.raises(ConfigError, match="cluster_timeout"):
            check_seconds(bad, "cluster_timeout")


def test_scheduler_killed_mid_stream_raises_instead_of_hanging(corpus_dir, tmp_path):
    with dask_cluster(tmp_path, 1) as (address, scheduler, _):
        # head_start=False: the windows wait for the lost scheduler (else computed here meanwhile)
        p = build(corpus_dir, address=address, prefetch_windows=1, cluster_timeout=3, head_start=False)
        with p:
            rows, err = _consume_after(p, lambda: scheduler.send_signal(signal.SIGKILL))
    assert isinstance(err, ClusterError) and isinstance(err, ConnectionError), err
    assert address in str(err)
    assert len(rows) < len(reference(p))


UNCAUGHT_SCRIPT = """
import sys, time
sys.path.insert(0, {root!r})
from pathlib import Path
from tests.helpers.pipelines import build

p = build(Path({corpus!r}), address={address!r}, prefetch_windows=4, cluster_timeout={timeout}, head_start=False)
stream = iter(p)
next(stream)
print("streaming", flush=True)
sys.stdin.readline()  # the scheduler is killed meanwhile
try:
    for batch in stream:
        pass
finally:
    print("error at", time.time(), flush=True)  # and left uncaught, as most training scripts do
"""


@pytest.mark.slow
def test_an_uncaught_stall_error_exits_without_waiting_on_the_dead_scheduler(corpus_dir, tmp_path):
    """The scheduler is killed; ClusterStallError after cluster_timeout is left uncaught, nothing
    closes the pipeline: the process exits soon after. Dask's own teardown of the client waited
    2 x cluster_timeout more at interpreter exit (the process exited 135 s after the kill with the
    default 45 s)."""
    timeout = 20
    with dask_cluster(tmp_path, 1) as (address, scheduler, _):
        script = tmp_path / "train.py"
        script.write_text(UNCAUGHT_SCRIPT.format(root=str(Path(__file__).resolve().parents[2]), corpus=str(corpus_dir),
                                                 address=address, timeout=timeout))
        proc = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().strip() == "streaming"
            scheduler.send_signal(signal.SIGKILL)
            proc.stdin.write("go\n")
            proc.stdin.flush()
            error_at = float(proc.stdout.readline().split()[-1])
            proc.wait(timeout=timeout + 60)
            exited = time.time() - error_at
        finally:
            proc.kill()
            err = proc.communicate(timeout=30)[1]
    assert proc.returncode == 1, err[-3000:]
    assert "zephon_dask.errors.ClusterStallError" in err or "zephon_dask.errors.ClusterError" in err, err[-3000:]
    assert exited < 1.5 * timeout, (exited, err[-3000:])  # Dask alone: 2 x cluster_timeout after the error


def test_a_scheduler_killed_and_restarted_at_its_address_is_reconnected_to(corpus_dir, tmp_path, caplog):
    """The scheduler and its worker SIGKILLed mid-stream, a new scheduler and worker started at the
    same address: the windows needed meanwhile are computed in the training process, the runner
    reconnects, the windows in flight are computed on the new cluster, and every batch equals the
    uninterrupted reference. Each step waits for the one before (no timing assumed)."""
    port, restarted = unused_port(), []
    caplog.set_level(logging.WARNING, logger="zephon_dask")
    try:
        with dask_cluster(tmp_path, 1, port=port) as (address, scheduler, workers):
            p = build(corpus_dir, address=address, prefetch_windows=2, cluster_timeout=120)
            with p:
                stream = iter(p)
                rows = [batch_rows(next(stream))]
                runner = p.session.runner()
                for proc in (scheduler, *workers):
                    proc.send_signal(signal.SIGKILL)
                for batch in stream:  # training goes on: the windows needed are computed here
                    rows.append(batch_rows(batch))
                    if runner.computed_here:
                        break
                here = len(runner.computed_here)
                assert here >= 1 and "scheduler lost" in runner.describe()
                restarted += start_dask(tmp_path, 1, port, limit=90)[1]
                _wait_for(lambda: not runner.outage(), "the runner to reconnect", limit=90)
                rows += [batch_rows(b) for b in stream]
                assert len(runner.computed_here) == here  # the rest came from the new cluster
    finally:
        stop_dask(restarted)
    assert rows == reference(p)
    messages = [r.getMessage() for r in caplog.records]
    assert any("lost the Dask scheduler" in m for m in messages), messages
    assert any("reconnected to the Dask scheduler" in m for m in messages), messages
    assert not any("lost with a worker" in m for m in messages), messages


def test_all_workers_lost_raises_a_stall_error(corpus_dir, tmp_path):
    with dask_cluster(tmp_path, 1) as (address, _, workers):
        p = build(corpus_dir, address=address, prefetch_windows=1, cluster_timeout=3)
        with p:
            rows, err = _consume_after(p, lambda: workers[0].send_signal(signal.SIGKILL))
    assert isinstance(err, ClusterStallError) and isinstance(err, TimeoutError), err
    assert "no worker" in str(err) and address in str(err) and "3 s" in str(err)


def test_a_finished_result_lost_with_every_worker_is_waited_for_without_spinning(tmp_path):
    """A result finished on a worker and not yet fetched dies with it (its future turns ``lost``,
    not done): the wait for it sleeps in slices and checks liveness, instead of waking at once in
    a loop, and raises within cluster_timeout plus a check."""
    from distributed import Client

    from zephon_dask.execution.watch import ClusterWatch

    with dask_cluster(tmp_path, 2) as (address, _, workers), Client(address, set_as_default=False) as client:
        futures = client.map(lambda i: bytes(1000) * i, range(4), pure=False)
        _wait_for(lambda: all(f.status == "finished" for f in futures), "4 finished results held")
        for w in workers:
            w.send_signal(signal.SIGKILL)
        _wait_for(lambda: not any(f.done() for f in futures), "the held results lost")
        watch = ClusterWatch(client, timeout=3, address=address)
        t = time.monotonic()
        with pytest.raises(ClusterStallError, match="no worker") as info:
            while watch.wait(futures) is None:
                assert time.monotonic() - t < 60, "no ClusterStallError"
        waited = time.monotonic() - t
    assert address in str(info.value) and "3 s" in str(info.value)
    # a slice lasts up to 1 s and the scheduler is asked at most once a second while a fault is
    # pending: a spinning wait made thousands of each a second
    assert watch.waits <= 5 * waited + 10, (watch.waits, waited)
    assert watch.checks <= 2 * waited + 5, (watch.checks, waited)


def test_all_workers_lost_mid_stream_raises_without_spinning(corpus_dir, tmp_path):
    """Every worker killed while windows are in flight (some computed and fetched ahead, some
    computing): the windows already here are served, then the wait for the others raises
    ClusterStallError within cluster_timeout plus a check, sleeping in slices meanwhile."""
    with dask_cluster(tmp_path, 2) as (address, _, workers):
        p = build(corpus_dir, address=address, prefetch_windows=6, cluster_timeout=3)
        with p:
            stream = iter(p)
            next(stream)
            watch, inflight = p.session.runner().watch, p.session.stream.fetcher.inflight
            _wait_for(lambda: sum(h.done() for h in list(inflight.values())) >= 3, "3 windows computed ahead")
            for w in workers:
                w.send_signal(signal.SIGKILL)
            waits, checks, t = watch.waits, watch.checks, time.monotonic()
            with pytest.raises(ClusterStallError, match="no worker") as info:
                for _ in stream:
                    pass
            waited = time.monotonic() - t
    assert address in str(info.value) and "3 s" in str(info.value)
    assert (watch.waits - waits) <= 5 * waited + 10, (watch.waits - waits, waited)
    assert (watch.checks - checks) <= 2 * waited + 5, (watch.checks - checks, waited)


@pytest.mark.parametrize("windows_per_task", [1, 2])
def test_frozen_worker_is_reported_and_its_windows_recomputed(corpus_dir, tmp_path, caplog, windows_per_task):
    """With two windows per task, a stalled task is reported naming both windows (as a stall of
    its own, or among the tasks rescued from the frozen worker once a window on it stalled), and
    its copy on the other worker gives the same bytes."""
    with dask_cluster(tmp_path, 2) as (address, _, workers):
        p = build(corpus_dir, address=address, prefetch_windows=4, stall_timeout=1, cluster_timeout=30,
                  windows_per_task=windows_per_task)
        truth = reference(p)
        with p, caplog.at_level(logging.WARNING, logger="zephon_dask.execution.cluster"):
            rows, err = _consume_after(p, lambda: workers[0].send_signal(signal.SIGSTOP))
    assert err is None
    assert rows == truth
    messages = [r.getMessage() for r in caplog.records]
    assert any("has been computing" in m for m in messages)
    if windows_per_task > 1:  # the task reported stalled, or rescued with the frozen worker's others
        assert any(re.search(r"windows \(lane \d+, window \d+\), \(lane \d+, window \d+\)", m)
                   for m in messages if "has been computing" in m or "stalled" in m), messages


def test_a_frozen_worker_costs_one_stall_timeout_not_one_per_window(corpus_dir, tmp_path, caplog):
    """Once a worker computing a stalled window is silent, every window in flight on it (computing
    or finished there) is computed again at once on the other worker, instead of each waiting out
    its own stall_timeout; the stream stays exact. The worker stays frozen to the end."""
    with dask_cluster(tmp_path, 2) as (address, _, workers):
        p = build(corpus_dir, address=address, prefetch_windows=8, stall_timeout=4, cluster_timeout=60)
        truth = reference(p)
        with p, caplog.at_level(logging.WARNING, logger="zephon_dask.execution.cluster"):
            rows, err = _consume_after(p, lambda: workers[0].send_signal(signal.SIGSTOP))
    assert err is None
    assert rows == truth
    messages = [r.getMessage() for r in caplog.records]
    assert sum("has been computing" in m for m in messages) <= 3, messages
    # the windows in flight on the frozen worker when it was found silent are computed again at
    # once (under load, the few in flight may all have been copied one by one before that)
    rescue = next((i for i, m in enumerate(messages) if "stalled (no heartbeat" in m), None)
    if rescue is not None:
        rescued = re.findall(r"lane \d+, window \d+", messages[rescue].split("in flight there: ")[1])
        assert rescued, messages[rescue]
        later = [m for m in messages[rescue + 1:] if "has been computing" in m]
        assert not [m for m in later if any(f"{w} has been" in m for w in rescued)], later  # none waited again


def test_user_client_closed_mid_stream_gives_a_typed_error(corpus_dir, tmp_path):
    from distributed import Client

    with dask_cluster(tmp_path, 1) as (address, _, _), Client(address, set_as_default=False) as client:
        p = build(corpus_dir, client=client, prefetch_windows=1, cluster_timeout=3)
        with p:
            rows, err = _consume_after(p, client.close)
    assert isinstance(err, ClusterError), err
    assert "closed" in str(err) and address in str(err)


def test_embedded_cluster_listens_on_loopback_only():
    import psutil

    from zephon_dask.execution.cluster import local_cluster

    with local_cluster(1) as cluster:
        procs = [psutil.Process(), *psutil.Process().children(recursive=True)]
        listening = {c.laddr.ip for p in procs for c in p.net_connections(kind="inet") if c.status == "LISTEN"}
        assert cluster.dashboard_link.startswith("http://127.0.0.1:")
    assert listening == {"127.0.0.1"}, listening


def test_short_soak_growth_is_bounded(tmp_path):
    """A few seconds of the soak benchmark: fds and threads stay flat, memory grows little."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        from bench_soak import growth, soak
    finally:
        sys.path.pop(0)
    samples = soak(seconds=8, every=1, n_workers=1, workdir=str(tmp_path))
    assert samples[-1].batches > samples[0].batches
    # every process sampled, memory in use through malloc (glibc here) and Python's small objects
    # (alive, and the arenas holding them) beside RSS
    names = ["scheduler", "trainer", "worker-0"]
    last = samples[-1]
    assert sorted(last.rss_mb) == sorted(last.in_use_mb) == sorted(last.py_live_mb) == sorted(last.py_arenas_mb) == names
    assert all(0 < last.py_live_mb[n] <= last.py_arenas_mb[n] < last.rss_mb[n] for n in names), last
    # the windows held: a worker's task results, the training process's windows fetched or being cut
    assert sorted(last.held_mb) == ["trainer", "worker-0"], last
    assert all(0 <= last.held_mb[n] < last.rss_mb[n] for n in last.held_mb) and last.held_mb["trainer"] > 0, last
    for name, g in growth(samples, warmup=3).items():
        assert g["fds"] <= 4 and g["threads"] <= 2, (name, g)
        assert g["rss"] < 0.25, (name, g)  # loose: the full soak (benchmarks/bench_soak.py) checks 2%
