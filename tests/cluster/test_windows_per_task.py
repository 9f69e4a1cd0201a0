"""Several windows per Dask task (``windows_per_task``) never change a byte: the fetcher groups
consecutive fused submissions, each window keeps its own handle, and the distributed runner
keeps its guarantees (a worker killed mid-group, resume, DP groups) for a task of several windows."""

from __future__ import annotations

import os
import signal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.oracles import (
    batch_rows,
    ref_group_stream,
    ref_grouped_submissions,
    ref_submissions,
)
from tests.helpers.pipelines import FakeSpec, build
from zephon_dask.consumer.fetcher import WindowFetcher
from zephon_dask.errors import ClosedError
from zephon_dask.execution.base import GroupResult, MemberHandle, WindowHandle
from zephon_dask.graph import group_graph, window_graph
from zephon_dask.graph.keys import windows_key
from zephon_dask.pipeline.ranks import owned_lanes


class Handle:
    def __init__(self, pair, released):
        self.pair, self.released = pair, released

    def result(self):
        return self.pair

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

    def submit_group(self, graphs, priority):
        assert all(g.fused for g in graphs)
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
    fetcher = WindowFetcher(FakeSpec(num_windows), runner, lanes, prefetch, start_windows=start, fused=True,
                            split_first=split_first, windows_per_task=size, alone_at_end=alone_at_end)
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


def test_automatic_windows_per_task_leaves_two_tasks_per_worker_thread(corpus_dir, cluster):
    """Auto: ``prefetch // (2 x threads)``, 1 to 4, on the distributed runner; 1 on the in-process
    runners; ``fuse=False`` never groups. The default prefetch on 2 worker threads (8) gives 2."""
    from zephon_dask.execution.cluster import DistributedRunner

    runner = DistributedRunner(build(corpus_dir).spec, client=cluster)
    assert [runner.windows_per_task(n) for n in (1, 4, 7, 8, 12, 100)] == [1, 1, 1, 2, 3, 4]
    runner.close()
    assert build(corpus_dir).description.settings["windows_per_task"] == 1  # the default: one window per task
    p = build(corpus_dir, client=cluster, windows_per_task=None)
    assert "auto: as many as leave 2 tasks" in str(p.explain())
    with p:
        next(iter(p))
        assert p.session.stream.fetcher.windows_per_task == 2
        assert "auto: 2 (" in str(p.explain())
    with build(corpus_dir, runner="threads", n_workers=1) as p:
        next(iter(p))
        assert p.session.stream.fetcher.windows_per_task == 1
    assert "1 (fuse=False" in str(build(corpus_dir, fuse=False, windows_per_task=3).explain())
