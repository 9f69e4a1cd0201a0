"""Several windows per Dask task (``windows_per_task``) never change a byte: the fetcher groups
consecutive fused submissions, each window keeps its own handle, and the distributed runner
keeps its guarantees (a worker killed mid-group, resume, DP groups) for a task of several windows."""

from __future__ import annotations

import os
import signal
import statistics
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.oracles import (
    batch_rows,
    ref_group_stream,
    ref_grouped_submissions,
    ref_submissions,
)
from tests.helpers.pipelines import FakeSpec, FakeWindow, build
from zephon_dask.consumer.fetcher import WindowFetcher
from zephon_dask.consumer.settings import ConsumerSettings
from zephon_dask.errors import ClosedError
from zephon_dask.execution.base import (
    AUTO_AFTER,
    AUTO_HELD_BYTES,
    CONTROL_SHARE,
    MAX_WINDOWS_PER_TASK,
    GroupResult,
    MemberHandle,
    WindowHandle,
    auto_windows_per_task,
    held_windows_per_task,
    most_windows_per_task,
)
from zephon_dask.execution.runner import DistributedRunner
from zephon_dask.graph import group_graph, window_graph
from zephon_dask.graph.keys import windows_key
from zephon_dask.pipeline.ranks import owned_lanes


class Handle:
    def __init__(self, pair, released, cpu=0.0):
        self.pair, self.released, self.cpu = pair, released, cpu

    def result(self):
        return FakeWindow(self.pair, self.cpu)

    def release(self):
        self.released.add(self.pair)

    def done(self):
        return True


class GroupingRunner:
    """Records each task submitted as its (lane, window) members, and which are still held."""

    def __init__(self):
        self.tasks, self.split, self.released = [], [], set()

    def submit(self, graph, priority):
        self.tasks.append(((graph.lane, graph.window),))
        self.split.append(not graph.fused)
        return Handle((graph.lane, graph.window), self.released)

    def submit_group(self, graphs, priority, stall_windows=None):
        assert all(g.fused for g in graphs)
        self.stall_windows = stall_windows
        self.tasks.append(tuple((g.lane, g.window) for g in graphs))
        self.split.append(False)
        return [Handle((g.lane, g.window), self.released) for g in graphs]

    def held(self):
        return {pair for task in self.tasks for pair in task} - self.released


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_fetcher_groups_consecutive_fused_windows_and_keeps_workers_fed(data):
    """The fetcher submits the oracle's tasks; each task is fused windows taken in the order they
    are needed (a split first window, one asked for out of turn, or one of the last ``alone_at_end``
    goes alone); windows in flight
    never pass ``prefetch`` (+1 for one asked for out of turn) and, while any is left to submit,
    never fall below ``prefetch - windows_per_task + 1``; with one window per task the order is
    the ungrouped fetcher's."""
    n = data.draw(st.integers(1, 8))
    lanes = data.draw(st.permutations(range(12)))[:n]
    num_windows = {lane: data.draw(st.one_of(st.none(), st.integers(0, 6))) for lane in lanes}
    start = {lane: data.draw(st.integers(0, 3)) for lane in lanes}
    prefetch, size = data.draw(st.integers(1, 10)), data.draw(st.integers(1, 5))
    split_first, alone_at_end = data.draw(st.integers(0, 4)), data.draw(st.integers(0, 3))
    gets = data.draw(st.lists(st.sampled_from(lanes), max_size=40))
    runner = GroupingRunner()
    fetcher = WindowFetcher(FakeSpec(num_windows), runner, lanes, ConsumerSettings(
        prefetch, fuse=True, split_first=split_first, windows_per_task=size, alone_at_end=alone_at_end),
        start_windows=start)
    for lane in gets:
        out = fetcher.get(lane)
        assert out is None or out[0] == lane
        held = len(runner.held())
        assert held <= prefetch
        left = any(num_windows[la] is None or fetcher.next_submit[la] < num_windows[la] for la in lanes)
        assert not left or held >= prefetch - min(size, prefetch) + 1
    assert runner.tasks == ref_grouped_submissions(num_windows, start, prefetch, gets, size, split_first,
                                                   alone_at_end)
    assert all(len(t) <= size for t in runner.tasks)
    assert not any(split and len(t) > 1 for split, t in zip(runner.split, runner.tasks, strict=True))
    if size == 1:
        assert [t[0] for t in runner.tasks] == ref_submissions(num_windows, start, prefetch, gets)
    if all(v is not None and fetcher.next_submit[la] >= v for la, v in num_windows.items()):  # all submitted
        assert all(len(t) == 1 for t in runner.tasks[max(0, len(runner.tasks) - alone_at_end):])
    fetcher.close()
    assert not runner.held()


class Task(WindowHandle):
    """A task's handle computing ``values``: counts fetches and releases."""

    def __init__(self, values):
        super().__init__(None)
        self.values, self.fetched, self.released = values, 0, 0

    def result(self):
        self.fetched += 1
        return self.values

    def release(self):
        self.released += 1


def test_group_result_is_fetched_once_and_released_as_soon_as_it_is_here_or_unwanted():
    spec = FakeSpec({0: None})
    graphs = [window_graph(spec, 0, w, True) for w in range(3)]
    task = Task(("a", "b", "c"))
    group = GroupResult(task, 3)
    members = [MemberHandle(g, group, i) for i, g in enumerate(graphs)]
    assert members[1].result() == "b" and (task.fetched, task.released) == (1, 1)
    assert members[0].result() == "a" and members[2].result() == "c" and task.fetched == 1
    with pytest.raises(ClosedError):
        members[0].result()  # taken and let go
    for m in members:
        m.release()
    assert task.released == 1

    task = Task(("a", "b"))
    group = GroupResult(task, 2)
    members = [MemberHandle(g, group, i) for i, g in enumerate(graphs[:2])]
    members[0].release()
    assert task.released == 0  # the other member may still want its window
    members[1].release()
    assert (task.fetched, task.released) == (0, 1)


def test_group_keys_name_every_member(corpus_dir):
    spec = build(corpus_dir).spec
    g = group_graph(spec, [window_graph(spec, lane, w, True) for lane, w in [(3, 0), (0, 1)]])
    assert g.key == windows_key(spec.fingerprint, [(3, 0), (0, 1)]) == f"zephon-windows-{spec.fingerprint[:16]}-3.0-0.1"
    assert g.key != group_graph(spec, [window_graph(spec, lane, w, True) for lane, w in [(3, 0), (0, 2)]]).key
    assert g.fused_copy(1).key == f"zephon-again-windows-{spec.fingerprint[:16]}-3.0-0.1-1"
    assert g.label == "windows (lane 3, window 0), (lane 0, window 1)"
    from dask.utils import key_split

    assert key_split(g.key) == "zephon-windows"


@pytest.fixture(scope="module")
def cluster():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as lc:
        with Client(lc, set_as_default=False) as client:
            yield client


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(size=st.sampled_from([None, 1, 2, 3, 5]), later=st.sampled_from([None, 2, 4]),
       prefetch=st.sampled_from([None, 2, 7]), degree=st.sampled_from([1, 2]), cut=st.integers(0, 60),
       seed=st.integers(0, 1000))
def test_groups_on_a_cluster_give_the_reference_batches_across_resume(corpus_dir, cluster, tmp_path_factory, size,
                                                                    later, prefetch, degree, cut, seed):
    """A DP group's batches with ``windows_per_task=size``, cut after ``cut`` batches and resumed
    with ``windows_per_task=later`` and another prefetch, are the reference's."""
    group = seed % degree
    opts = dict(seed=seed % 4, client=cluster, dp_degree=degree, dp_group_id=group, k=1)
    first = build(corpus_dir, prefetch_windows=prefetch, windows_per_task=size, **opts)
    truth = ref_group_stream(first.spec, owned_lanes(first.description.settings), first.description.batch.microbatch_size)
    with first:
        it = iter(first)
        got = [batch_rows(b) for _, b in zip(range(cut), it, strict=False)]
        state = first.state_dict()
    resumed = build(corpus_dir, prefetch_windows=8, windows_per_task=later, **opts).load_state_dict(state)
    with resumed:
        got += [batch_rows(b) for b in resumed]
    assert got == truth


def test_worker_killed_mid_group_changes_nothing(corpus_dir):
    """Three windows per task on two worker processes: one computing or holding a task of several
    windows is killed while the stream runs; the scheduler computes its tasks again from the same
    inputs and the batches are the reference's."""
    from distributed import Client, LocalCluster, get_task_stream

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as lc, \
            Client(lc, set_as_default=False) as client:
        p = build(corpus_dir, client=client, prefetch_windows=9, windows_per_task=3, retries=0, k=1)
        truth = ref_group_stream(p.spec, owned_lanes(p.description.settings), p.description.batch.microbatch_size)
        with get_task_stream(client=client) as ts:
            it = iter(p)
            got = [batch_rows(next(it))]
            busy = {w: [*ks, *client.has_what()[w]] for w, ks in client.processing().items()}
            victim = min(busy, key=lambda w: not any(str(k).startswith("zephon-windows-") for k in busy[w]))
            os.kill(client.run(os.getpid)[victim], signal.SIGKILL)  # one computing or holding a group
            got += [batch_rows(b) for b in it]
        p.close()
    assert got == truth
    assert any(str(t["key"]).startswith("zephon-windows-") for t in ts.data)


@settings(max_examples=300, deadline=None)
@given(window_cpu=st.floats(0, 1), task_cpu=st.floats(0, 0.05), prefetch=st.one_of(st.none(), st.integers(1, 200)),
       threads=st.integers(1, 64))
def test_automatic_size_is_the_fewest_windows_that_make_a_task_cheap_next_to_their_work(window_cpu, task_cpu,
                                                                                      prefetch, threads):
    """1 to the ceiling (MAX, and two tasks in flight per worker thread when the prefetch is
    given); 1 where a task costs nothing or a window's work already dwarfs it; else the fewest
    windows whose share of a task's cost is at most CONTROL_SHARE of a window's work, unless
    capped; never more windows for more work per window."""
    cap = most_windows_per_task(prefetch, threads)
    assert cap == (MAX_WINDOWS_PER_TASK if prefetch is None
                   else max(1, min(MAX_WINDOWS_PER_TASK, prefetch // (2 * threads))))
    n = auto_windows_per_task(window_cpu, task_cpu, cap)
    assert 1 <= n <= cap
    if task_cpu == 0 or task_cpu <= CONTROL_SHARE * window_cpu:
        assert n == 1
    elif n < cap:
        assert task_cpu / n <= CONTROL_SHARE * window_cpu * (1 + 1e-9)  # cheap enough with n
        assert n == 1 or task_cpu / (n - 1) > CONTROL_SHARE * window_cpu  # and not with one fewer
    assert auto_windows_per_task(window_cpu * 2 + 1e-6, task_cpu, cap) <= n


class TimedRunner(GroupingRunner):
    """A runner whose tasks cost ``task_cpu`` besides their work, whose windows took the CPU seconds
    ``cpu(lane, window)`` says, and which keeps the first value agreed under each name."""

    def __init__(self, task_cpu, cpu, agreed=None):
        super().__init__()
        self.task_cpu, self.cpu, self.fetcher, self.sizes = task_cpu, cpu, None, []
        self.agreed = dict(agreed or {})

    def agree(self, name, value):
        return self.agreed.setdefault(name, value)

    def _timed(self, pair):
        return Handle(pair, self.released, self.cpu(*pair))

    def submit(self, graph, priority):
        super().submit(graph, priority)
        self.sizes.append(self.fetcher.windows_per_task if self.fetcher is not None else 1)
        return self._timed((graph.lane, graph.window))

    def submit_group(self, graphs, priority, stall_windows=None):
        super().submit_group(graphs, priority, stall_windows)
        assert stall_windows == 1  # an automatic group computes about as long as one window
        self.sizes.append(self.fetcher.windows_per_task)
        return [self._timed((g.lane, g.window)) for g in graphs]


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_automatic_grouping_follows_the_first_windows_cpu_and_never_changes_what_is_delivered(data):
    """windows_per_task=None: each lane gets its windows in order whatever the grouping (what one
    window per task gives); the first max(AUTO_AFTER, prefetch) windows taken go one per task, then
    every task has at most the size the rule gives for their median CPU, or the size agreed
    earlier under the same name (a peer's); the windows in flight stay within prefetch (scaled: x
    the size). A runner whose tasks cost nothing never groups and submits what the ungrouped
    fetcher does."""
    n = data.draw(st.integers(1, 6))
    lanes = data.draw(st.permutations(range(10)))[:n]
    num_windows = {lane: data.draw(st.one_of(st.none(), st.integers(0, 12))) for lane in lanes}
    prefetch = data.draw(st.integers(1, 8))
    task_cpu = data.draw(st.sampled_from([0.0, 0.006]))
    scale = data.draw(st.booleans())
    peer = data.draw(st.one_of(st.none(), st.integers(1, MAX_WINDOWS_PER_TASK)))
    costs = data.draw(st.lists(st.sampled_from([0.0005, 0.003, 0.03, 0.3]), min_size=1, max_size=4))
    split_first, alone_at_end = data.draw(st.integers(0, 3)), data.draw(st.integers(0, 2))
    gets = data.draw(st.lists(st.sampled_from(lanes), max_size=60))
    runner = TimedRunner(task_cpu, lambda lane, w: costs[(lane + w) % len(costs)],
                         {} if peer is None else {"windows-per-task": peer})
    fetcher = WindowFetcher(FakeSpec(num_windows), runner, lanes, ConsumerSettings(
        prefetch, fuse=True, split_first=split_first, windows_per_task=None, alone_at_end=alone_at_end,
        scale_prefetch=scale, threads=2))
    runner.fetcher = fetcher
    expected, cpus = dict.fromkeys(lanes, 0), []
    for lane in gets:
        out = fetcher.get(lane)
        if out is None:
            assert num_windows[lane] is not None and expected[lane] >= num_windows[lane]
            continue
        assert tuple(out) == (lane, expected[lane])
        expected[lane] += 1
        cpus.append(out.made.cpu)
        assert len(runner.held()) <= fetcher.prefetch
        if len(cpus) < max(AUTO_AFTER, prefetch):
            assert fetcher.deciding and fetcher.windows_per_task == 1 and fetcher.prefetch == prefetch
    assert all(len(task) <= size for task, size in zip(runner.tasks, runner.sizes, strict=True))
    if len(cpus) >= max(AUTO_AFTER, prefetch):
        first = cpus[:max(AUTO_AFTER, prefetch)]
        assert fetcher.window_cpu == statistics.median(first)
        own = auto_windows_per_task(statistics.median(first), task_cpu)
        size = min(own if peer is None else peer, most_windows_per_task(None if scale else prefetch, 2))
        assert fetcher.windows_per_task == min(size, fetcher.prefetch)
        assert fetcher.prefetch == (prefetch * size if scale else prefetch)
        if task_cpu == 0 and peer is None:
            assert fetcher.windows_per_task == 1
    if task_cpu == 0 and peer is None:
        assert [t[0] for t in runner.tasks] == ref_submissions(num_windows, dict.fromkeys(lanes, 0), prefetch, gets)
    fetcher.close()
    assert not runner.held()


class LargeWindow(FakeWindow):
    """A stand-in window holding ``nbytes`` (stored tokens: cheap to make, large to hold)."""

    def __new__(cls, pair, cpu, nbytes):
        out = super().__new__(cls, pair, cpu)
        out.nbytes = nbytes
        return out

    def __sizeof__(self):
        return self.nbytes


@settings(max_examples=60, deadline=None)
@given(nbytes=st.sampled_from([1 << 10, 1 << 20, 5 << 20, 40 << 20, 300 << 20]), prefetch=st.integers(1, 8),
       given_bytes=st.one_of(st.none(), st.just(1 << 30)))
def test_a_scaled_prefetch_of_cheap_large_windows_holds_a_bounded_number_of_bytes(nbytes, prefetch, given_bytes):
    """Windows that cost little CPU but hold many bytes: the automatic size still scales the
    prefetch, but never past AUTO_HELD_BYTES (or what the unscaled prefetch held already), unless
    prefetch_bytes is given (then that bound applies instead); what is delivered is unchanged."""
    runner = TimedRunner(0.006, lambda lane, w: 0.0005)
    runner._timed = lambda pair: type("H", (Handle,), {"result": lambda h: LargeWindow(h.pair, h.cpu, nbytes)})(
        pair, runner.released, 0.0005)
    fetcher = WindowFetcher(FakeSpec({0: None}), runner, [0], ConsumerSettings(
        prefetch, fuse=True, windows_per_task=None, scale_prefetch=True, threads=1, prefetch_bytes=given_bytes))
    runner.fetcher = fetcher
    for w in range(max(AUTO_AFTER, prefetch) + 3):
        assert tuple(fetcher.get(0)) == (0, w)
    assert not fetcher.deciding
    if given_bytes is None:
        assert fetcher.windows_per_task == min(MAX_WINDOWS_PER_TASK, held_windows_per_task(prefetch, nbytes))
        assert fetcher.prefetch * nbytes <= max(AUTO_HELD_BYTES, prefetch * nbytes)
    else:
        assert fetcher.windows_per_task == MAX_WINDOWS_PER_TASK
    fetcher.close()


def test_a_member_counts_its_window_once_its_task_fetched_it_ahead():
    """Before any member is taken, each member of a task fetched ahead counts its own window's
    bytes (the fetcher's held_nbytes sums its members), and none once taken or released."""
    spec = FakeSpec({0: None})
    graphs = [window_graph(spec, 0, w, True) for w in range(3)]

    class Fetched(Task):
        held = property(lambda self: self.values)

    windows = (np.zeros(1000, np.int32), np.zeros(10, np.int32), np.zeros(300, np.int32))
    group = GroupResult(Fetched(windows), 3)
    members = [MemberHandle(g, group, i) for i, g in enumerate(graphs)]
    assert [m.held_nbytes for m in members] == [w.__sizeof__() for w in windows]
    members[1].result()
    assert [m.held_nbytes for m in members] == [windows[0].__sizeof__(), 0, windows[2].__sizeof__()]
    members[0].release()
    assert members[0].held_nbytes == 0 and members[2].held_nbytes == windows[2].__sizeof__()


def test_windows_fetched_ahead_in_a_group_count_in_held_nbytes(corpus_dir, cluster):
    """Three windows per task on a cluster: every window in flight is fetched ahead, its task's
    result counted once per member in the fetcher's held_nbytes; the batches are the reference's."""
    p = build(corpus_dir, client=cluster, prefetch_windows=6, windows_per_task=3)
    truth = ref_group_stream(p.spec, owned_lanes(p.description.settings), p.description.batch.microbatch_size)
    with p:
        it = iter(p)
        got = [batch_rows(next(it))]
        fetcher = p.session.stream.fetcher
        members = [h for h in fetcher.inflight.values() if isinstance(h, MemberHandle)]
        assert members
        deadline = time.monotonic() + 60
        while not all(h.held_nbytes > 0 for h in members):
            assert time.monotonic() < deadline, "windows of a task fetched ahead not counted"
            time.sleep(0.05)
        assert fetcher.held_nbytes >= sum(h.held_nbytes for h in members)
        got += [batch_rows(b) for b in it]
    assert got == truth


def test_automatic_windows_per_task_groups_small_windows_on_a_cluster_only(corpus_dir, cluster):
    """The default (None, automatic) on a cluster: the test corpus's windows take a few ms of CPU,
    so after the first windows they go several per task (zephon-windows- tasks, each reported
    stalled after one stall_timeout), the default prefetch scaled alike; explain says why; the batches are the reference's. The threads runner
    never groups. A given prefetch caps the size at two tasks in flight per worker thread."""
    from distributed import get_task_stream

    assert build(corpus_dir).description.settings["windows_per_task"] is None  # the default
    assert "auto: 1 for the first prefetch_windows windows" in str(build(corpus_dir, client=cluster).explain())
    p = build(corpus_dir, client=cluster, R=8, k=1)
    truth = ref_group_stream(p.spec, owned_lanes(p.description.settings), p.description.batch.microbatch_size)
    with p, get_task_stream(client=cluster) as ts:
        got, stalls = [], set()
        for b in p:
            got.append(batch_rows(b))
            tasks = [h.task for h in p.session.stream.fetcher.inflight.values() if isinstance(h, MemberHandle)]
            stalls |= {t.stall_after for t in tasks if t is not None}
        assert stalls == {p.session.runner().stall}  # a group of the automatic size: one stall_timeout
        fetcher = p.session.stream.fetcher
        assert fetcher.window_cpu is not None and fetcher.window_cpu < DistributedRunner.task_cpu / CONTROL_SHARE
        size = fetcher.windows_per_task
        assert size > 1 and fetcher.prefetch == fetcher.base_prefetch * size
        text = str(p.explain())
        assert f"auto: {size} (the first" in text and f"auto: {fetcher.prefetch} (" in text
    assert got == truth
    assert any(str(t["key"]).startswith("zephon-windows-") for t in ts.data)
    with build(corpus_dir, client=cluster, prefetch_windows=4) as p:  # 4 // (2 x 2 threads): 1
        list(p)
        assert p.session.stream.fetcher.windows_per_task == 1 and p.session.stream.fetcher.prefetch == 4
    with build(corpus_dir, runner="threads", n_workers=1) as p:
        list(p)
        assert p.session.stream.fetcher.windows_per_task == 1
        assert "auto: 1 (the threads runner's tasks cost nothing" in str(p.explain())
    assert "1 (fuse=False" in str(build(corpus_dir, fuse=False, windows_per_task=3).explain())


def test_peers_sharing_a_cluster_take_the_first_ones_automatic_size(corpus_dir, cluster, monkeypatch):
    """Two consumers of the same lanes on one cluster (tensor-parallel peers), whose own automatic
    choice differs: the second takes the first one's size, so both submit the same tasks (keys),
    and both get the reference's batches."""
    from distributed import get_task_stream

    from zephon_dask.consumer import fetcher as fetcher_module

    keys, sizes, got = [], [], []
    for own in (2, 5):
        monkeypatch.setattr(fetcher_module, "auto_windows_per_task", lambda *args, own=own: own)
        p = build(corpus_dir, client=cluster, seed=11, R=8, k=1)
        with p, get_task_stream(client=cluster) as ts:
            got.append([batch_rows(b) for b in p])
            sizes.append(p.session.stream.fetcher.windows_per_task)
        keys.append(sorted(str(t["key"]) for t in ts.data if str(t["key"]).startswith("zephon-windows-")))
    assert sizes == [2, 2]
    assert keys[0] and keys[0] == keys[1]
    assert got[0] == got[1] == ref_group_stream(p.spec, owned_lanes(p.description.settings),
                                                p.description.batch.microbatch_size)
