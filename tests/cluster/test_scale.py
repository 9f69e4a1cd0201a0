"""Scale: the consumer's work per batch does not grow with the lanes, and the scale benchmark's
quickest run keeps batches byte-identical and windows in flight bounded."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.oracles import ref_submissions
from tests.helpers.pipelines import FakeSpec, FakeWindow
from zephon_dask.consumer.fetcher import WindowFetcher
from zephon_dask.consumer.settings import ConsumerSettings
from zephon_dask.errors import ClusterStallError
from zephon_dask.execution.watch import POLL
from zephon_dask.pipeline.ranks import owned_lanes


class Handle:
    def __init__(self, pair):
        self.pair = pair

    def result(self):
        return FakeWindow(self.pair)

    def release(self):
        pass

    def done(self):
        return True


class RecordingRunner:
    def __init__(self):
        self.submitted = []
        self.fused = []

    def submit(self, graph, priority):
        self.submitted.append((graph.lane, graph.window))
        self.fused.append(graph.fused)
        return Handle((graph.lane, graph.window))


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_fetcher_submits_in_the_reference_order(data):
    """The fetcher's heap submits exactly what a scan over every lane at each submission would."""
    n = data.draw(st.integers(1, 8))
    lanes = data.draw(st.permutations(range(12)))[:n]
    num_windows = {lane: data.draw(st.one_of(st.none(), st.integers(0, 6))) for lane in lanes}
    start = {lane: data.draw(st.integers(0, 3)) for lane in lanes}
    prefetch = data.draw(st.integers(1, 10))
    gets = data.draw(st.lists(st.sampled_from(lanes), max_size=40))
    runner = RecordingRunner()
    fetcher = WindowFetcher(FakeSpec(num_windows), runner, lanes, ConsumerSettings(prefetch, fuse=True),
                            start_windows=start)
    for lane in gets:
        out = fetcher.get(lane)
        assert out is None or out[0] == lane
    assert runner.submitted == ref_submissions(num_windows, start, prefetch, gets)


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_fetcher_splits_only_the_first_and_last_windows_it_submits(data):
    """With ``fused``, a window is split into chunk tasks exactly when it is its lane's first and one
    of the first ``split_first`` submitted (as many as the workers compute together), or one of the
    iteration's last ``split_last`` windows when every lane ends (the workers then share the end
    chunk by chunk); without, always. The order of submissions does not depend on it."""
    n = data.draw(st.integers(1, 8))
    lanes = data.draw(st.permutations(range(12)))[:n]
    num_windows = {lane: data.draw(st.one_of(st.none(), st.integers(0, 4))) for lane in lanes}
    start = {lane: data.draw(st.integers(0, 2)) for lane in lanes}
    prefetch, split_first = data.draw(st.integers(1, 10)), data.draw(st.integers(0, 10))
    split_last = data.draw(st.integers(0, 4))
    fused = data.draw(st.booleans())
    gets = data.draw(st.lists(st.sampled_from(lanes), max_size=30))
    runner = RecordingRunner()
    fetcher = WindowFetcher(FakeSpec(num_windows), runner, lanes, ConsumerSettings(
        prefetch, fuse=fused, split_first=split_first, split_last=split_last), start_windows=start)
    for lane in gets:
        fetcher.get(lane)
    assert runner.submitted == ref_submissions(num_windows, start, prefetch, gets)
    ends = all(n is not None for n in num_windows.values())
    total = sum(max(0, n - start[lane]) for lane, n in num_windows.items()) if ends else None
    first = [w == start[lane] and i < split_first for i, (lane, w) in enumerate(runner.submitted)]
    last = [total is not None and i >= total - split_last for i in range(len(runner.submitted))]
    split = [not fused or f or la for f, la in zip(first, last, strict=True)]
    assert runner.fused == [not s for s in split]
    if fused:
        assert sum(first) == min(split_first, len({lane for lane, w in runner.submitted[:split_first]
                                                   if w == start[lane]}))
        if total is not None and len(runner.submitted) == total:  # the iteration's end was submitted
            assert sum(last) == min(split_last, total)


def test_bench_scale_quickest_run(tmp_path):
    """64 lanes on 8 thread workers: batches equal the synchronous runner's, and the scheduler never
    held more than prefetch_windows + 2 windows: a window asked for out of turn is submitted before
    the one taken is released, and Dask delivers a release after the next submission. No time is
    asserted."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        from bench_scale import build, docs_needed, reference_sha, run_config, write_corpus
    finally:
        sys.path.pop(0)
    batches = 96
    write_corpus(str(tmp_path), docs_needed(64, batches, 8, 2))
    ref = reference_sha(build(str(tmp_path), 64), batches)
    r = run_config(str(tmp_path), 64, 8, batches, batches, ref, idle_s=0.0)
    assert r.sha_ok
    assert r.option == "auto" and r.prefetch == (2 * 8 + 4) * r.windows_per_task  # the default prefetch, scaled
    assert 0 < r.max_in_flight <= r.prefetch + 2
    assert r.windows > 0


def test_ranks_sharing_a_cluster_split_its_threads_for_prefetch(tmp_path):
    """On a cluster the pipeline did not start, a group owning 2 of 8 lanes prefetches for a
    quarter of the 8 worker threads (2 x 2 + 4 windows), not for all of them (2 x 8 + 4)."""
    from distributed import Client, LocalCluster

    from tests.helpers.pipelines import build, write_corpus

    write_corpus(tmp_path / "web", docs=400)  # 12 windows for the group's 2 lanes
    write_corpus(tmp_path / "code", docs=400, prefix="code")
    with LocalCluster(processes=False, n_workers=8, threads_per_worker=1, dashboard_address=None) as cluster, \
            Client(cluster, set_as_default=False) as client:
        whole = build(tmp_path, R=8, client=client)
        group = build(tmp_path, R=8, client=client, dp_degree=4, dp_group_id=1)
        with whole, group:
            assert whole.session.runner().default_prefetch(8) == 2 * 8 + 4
            assert group.session.runner().default_prefetch(len(owned_lanes(group.description.settings))) == 2 * 2 + 4
            next(iter(group))
            assert 0 < group.stats().windows_in_flight <= 2 * 2 + 4
            assert "auto: 8 " in str(group.explain())


@pytest.fixture
def thread_client():
    """Makes clients of in-process clusters (``n_workers`` threads each, 1 by default); closes them after."""
    from distributed import Client, LocalCluster

    def make(n_workers: int = 1):
        cluster = LocalCluster(processes=False, n_workers=n_workers, threads_per_worker=1, dashboard_address=None)
        made.append((cluster, Client(cluster, set_as_default=False)))
        return made[-1][1]

    made: list = []
    yield make
    for cluster, client in made:
        client.close()
        cluster.close()


_GATE = threading.Event()


def _wait_at_the_gate() -> bool:
    return _GATE.wait(60)


@pytest.fixture
def held():
    """A task that runs until the test ends (in-process workers: their thread waits on an event of
    this process, at most 60 s); empty waits on it end empty however slow the machine is."""
    _GATE.clear()
    yield _wait_at_the_gate
    _GATE.set()


@pytest.fixture
def hourly_checks(monkeypatch):
    """Liveness RPCs at most once an hour while waits end empty (a watch made with a timeout of
    2 h), so "not again" never depends on how fast this machine runs the test."""
    from zephon_dask.execution import watch

    monkeypatch.setattr(watch, "CHECK_EVERY", 3600.0)
    return 7200.0


def test_a_wait_that_ends_in_time_costs_the_scheduler_no_rpc(thread_client, held, hourly_checks):
    """Waiting for a window that finishes within the slice sends no liveness RPC; a slice that ends
    without it does."""
    from zephon_dask.execution.watch import ClusterWatch

    client = thread_client()
    watch = ClusterWatch(client, timeout=hourly_checks)
    fut = client.submit(int, 1, pure=False)
    assert watch.wait([fut], timeout=20) is fut
    assert watch.checks == 0
    slow = client.submit(held, pure=False)
    assert watch.wait([slow], timeout=0.05) is None
    assert watch.checks == 1
    assert watch.wait([slow], timeout=0.05) is None  # checked just now: not again within the interval
    assert watch.checks == 1


def test_empty_waits_check_liveness_at_most_every_few_seconds_unless_a_fault_is_pending(thread_client, held,
                                                                                         hourly_checks):
    import time

    from zephon_dask.execution.watch import ClusterWatch

    client = thread_client()
    watch = ClusterWatch(client, timeout=hourly_checks)
    slow = client.submit(held, pure=False)
    for _ in range(4):
        assert watch.wait([slow], timeout=0.02) is None
    assert watch.checks == 1  # the first empty slice checks; the next ones, within the interval, do not
    idle = thread_client(n_workers=0)  # a fault: once seen, checked every second until it raises
    watch = ClusterWatch(idle, timeout=0.3)
    never = idle.submit(time.sleep, 0, pure=False)
    t = time.monotonic()
    with pytest.raises(ClusterStallError, match="no worker"):
        for _ in range(1000):
            watch.wait([never], timeout=0.02)
    assert 2 <= watch.checks <= 2 + (time.monotonic() - t) / POLL, watch.checks
    assert watch.waits >= watch.checks
