"""The head start: the first windows computed in the training process while the embedded
cluster starts, the rest on the cluster, the same bytes either way."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import zephon_dask as z
from tests.helpers.oracles import batch_rows, ref_group_stream
from tests.helpers.pipelines import build, child_pids, wait_for, wait_until_no_new_processes
from zephon_dask import compute_window
from zephon_dask.core.window import compute_chunk
from zephon_dask.errors import ClosedError, ClusterError
from zephon_dask.execution import runner as runner_mod
from zephon_dask.execution.head_start import HeadStart, LargestFirst, compute_here
from zephon_dask.execution.local import SynchronousRunner
from zephon_dask.graph import group_graph, window_graph
from zephon_dask.pipeline.ranks import owned_lanes


def reference(pipeline):
    return ref_group_stream(pipeline.spec, owned_lanes(pipeline.description.settings), pipeline.description.batch.microbatch_size)


def same_window(a, b) -> bool:
    return pickle.dumps(a.widened().table) == pickle.dumps(b.widened().table) and a.window == b.window


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(prefetch=st.sampled_from([None, 1, 3]), fuse=st.booleans(), n_workers=st.integers(1, 2),
       head_start=st.booleans(), microbatch=st.integers(1, 4), per_task=st.sampled_from([None, 1, 3]))
def test_embedded_cluster_with_and_without_head_start_matches_reference(corpus_dir, prefetch, fuse, n_workers,
                                                                        head_start, microbatch, per_task):
    """Windows offered to the head start stay one per task; later ones are grouped (``per_task``)."""
    p = build(corpus_dir, microbatch=microbatch, n_workers=n_workers, prefetch_windows=prefetch, fuse=fuse,
              head_start=head_start, windows_per_task=per_task)
    with p:
        got = [batch_rows(b) for b in p]
        here = p.session.runner().computed_here
    assert got == reference(p)
    if head_start:
        assert here and here[0] == (0, 0)  # the first window the stream needs came from this process
    else:
        assert here == []


FIRST_BATCH_SCRIPT = """
import json, sys, threading
from pathlib import Path

class ImportedBy:  # the thread that first imports distributed
    thread = None
    def find_spec(self, name, path=None, target=None):
        if name == "distributed" and ImportedBy.thread is None:
            ImportedBy.thread = threading.current_thread().name

sys.meta_path.insert(0, ImportedBy())
from tests.helpers.oracles import batch_rows
from tests.helpers.pipelines import build
p = build(Path(sys.argv[1]), retries=0)  # a window failing here raises
with p:
    it = iter(p)
    first = batch_rows(next(it))
    at_first = ImportedBy.thread
    rest = [batch_rows(b) for b in it]
print(json.dumps({"imported_by_at_first_batch": at_first, "batches": [first, *rest]}))
"""


def test_the_first_batch_does_not_wait_for_the_distributed_import(corpus_dir):
    """On the default runner (embedded cluster, head start), a fresh process has its first batch
    without importing ``distributed`` on its own thread: only the cluster's start imports it, on
    its thread, once the head start's first window is done; every batch is the reference's."""
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", FIRST_BATCH_SCRIPT, str(corpus_dir)], cwd=root,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["imported_by_at_first_batch"] in (None, "zephon-cluster-start")
    assert [tuple(b) for b in got["batches"]] == reference(build(corpus_dir))


WINDOW_IMPORTS_SCRIPT = """
import json, sys, threading
from pathlib import Path

class Imports:  # (module, thread) of every import from here on
    seen = []
    def find_spec(self, name, path=None, target=None):
        Imports.seen.append((name, threading.current_thread().name))

from tests.helpers.oracles import batch_rows
from tests.helpers.pipelines import build
p = build(Path(sys.argv[1]), retries=0)
with p:
    sys.meta_path.insert(0, Imports())
    next(iter(p))
    print(json.dumps(Imports.seen))
"""


def test_the_head_start_imports_nothing_while_it_computes_the_first_window(corpus_dir):
    """A module imported on first use inside the first window's chunk tasks (``numpy.ma`` by
    ``np.unique``) holds the import lock and the GIL while the window's threads tokenize: the
    library imports what its tasks use with itself, so a fresh process's head-start threads import
    nothing before the first batch."""
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", WINDOW_IMPORTS_SCRIPT, str(corpus_dir)], cwd=root,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert [name for name, thread in seen if thread.startswith("zephon-head-start")] == []


@pytest.mark.parametrize("threads", [2, 3])
def test_a_window_here_reads_its_chunks_in_order_and_tokenizes_the_largest_first(corpus_dir, threads):
    """The head start's pool: each chunk is read once; each chunk taken is the largest read and
    not yet taken, so the window's threads finish together. The outputs are compute_chunk's, in
    chunk order."""
    from concurrent.futures import ThreadPoolExecutor

    spec = build(corpus_dir).spec
    chunks = spec.window_chunks(0, 0)
    plan = LargestFirst(spec, chunks)
    finished = []
    with ThreadPoolExecutor(threads) as pool:
        outs = plan.run(pool, threads, lambda: finished.append(1))
    assert [o.chunk for o in outs] == list(chunks) and len(finished) == len(chunks)
    for out, g in zip(outs, chunks, strict=True):
        assert pickle.dumps(out.table) == pickle.dumps(compute_chunk(spec, g).table)
    assert sorted(e[1] for e in plan.log if e[0] == "read") == list(range(len(chunks)))
    ready: dict[int, int] = {}
    for event in plan.log:  # replayed: every take is the largest chunk ready then
        if event[0] == "read":
            ready[event[1]] = event[2]
        else:
            assert ready[event[1]] == max(ready.values())
            del ready[event[1]]
    assert ready == {}
    assert len({size for _, _, size in (e for e in plan.log if e[0] == "read")}) > 1  # the order mattered


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lane=st.integers(0, 3), first=st.integers(0, 3), size=st.integers(1, 3), threads=st.integers(1, 3),
       fused=st.booleans())
def test_a_task_computed_here_gives_a_workers_bytes(corpus_dir, lane, first, size, threads, fused):
    """What the runner computes here while its scheduler is lost: a window (fused or split) or a
    group of windows, each equal to compute_window's, one window at a time (the reference)."""
    spec = build(corpus_dir).spec
    members = [w for w in range(first, first + size) if w < spec.num_windows(lane)]
    if not members:
        return
    graphs = [window_graph(spec, lane, w, fused or size > 1) for w in members]
    graph = graphs[0] if size == 1 else group_graph(spec, graphs)
    value = compute_here(spec, graph, threads)
    outs = value if isinstance(value, tuple) else (value,)
    assert [(o.lane, o.window) for o in outs] == [(lane, w) for w in members]
    for out, w in zip(outs, members, strict=True):
        assert pickle.dumps(out.table) == pickle.dumps(compute_window(spec, lane, w).narrowed().table)


def test_a_chunk_that_fails_to_read_here_stops_the_window_and_is_raised(corpus_dir):
    from concurrent.futures import ThreadPoolExecutor

    from zephon_dask.errors import ChunkOutOfRangeError

    spec = build(corpus_dir).spec
    plan = LargestFirst(spec, [*spec.window_chunks(0, 0), 10**9])  # the last read fails
    with ThreadPoolExecutor(2) as pool, pytest.raises(ChunkOutOfRangeError, match="outside the stream"):
        plan.run(pool, 2, lambda: None)


def test_a_window_is_computed_here_while_another_thread_imports_distributed():
    """While the cluster's start imports ``distributed`` on its thread, the module is in
    ``sys.modules`` half made (no ``get_worker`` yet); a window the head start computes meanwhile
    is made here (in a fresh process: this one's ``distributed`` stays whole for other threads)."""
    code = ("import sys, types; sys.modules['distributed'] = types.ModuleType('distributed'); "
            "from zephon_dask.core.window import _here; print(_here())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.startswith("pid "), out.stderr[-3000:]


def _windows(spec, n):
    order = [(lane, w) for w in range(3) for lane in range(spec.canonical_replicas)]
    return [pair for pair in order if w_exists(spec, *pair)][:n]


def w_exists(spec, lane, w) -> bool:
    total = spec.num_windows(lane)
    return total is None or w < total


def test_windows_are_computed_here_in_priority_order_then_handed_to_the_cluster(corpus_dir):
    spec = build(corpus_dir).spec
    computed: list[tuple[int, int]] = []
    head = HeadStart(spec, 2, False, computed)
    pairs = _windows(spec, 6)
    handles = {pair: head.offer(window_graph(spec, *pair), priority=-i) for i, pair in enumerate(pairs)}
    assert head.first_window.wait(30)
    sent: list[tuple[int, int]] = []
    sync = SynchronousRunner(spec)

    def send(graph, priority):
        sent.append((graph.lane, graph.window))
        return sync.submit(graph, priority)

    head.hand_over(send)
    assert head.offer(window_graph(spec, *pairs[0]), 0) is None  # from now on: the cluster
    for pair, handle in handles.items():
        assert same_window(handle.result(), compute_window(spec, *pair))
    # the first ones here, in priority order, the rest to the cluster in priority order
    assert 1 <= len(computed) < len(pairs)
    assert computed == pairs[:len(computed)] and sent == pairs[len(computed):]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("error", [RuntimeError, ConnectionResetError])
@pytest.mark.parametrize("retry_remotely", [False, True])
def test_a_window_that_fails_here_fails_with_its_pointer_or_goes_to_the_cluster(corpus_dir, retry_remotely, error,
                                                                                threads):
    """The user's own exception would come back on every try: it fails here. An I/O error (from
    outside the window's pure function) goes to the cluster, if the runner has one."""
    def explode(rec):
        if "web 1/7 " in rec["text"]:
            raise error("bad record")
        return rec

    web = z.Dataset.from_jsonl("web", str(corpus_dir / "web"), progress=False)
    p = z.Pipeline(z.MixtureWorkSource([web], chunk_size=12, seed=1)).map(explode).tokenize().pack(64).batch(2)
    spec = p.options(canonical_replicas=2).spec
    bad = next((lane, w) for lane in range(2) for w in range(spec.num_windows(lane))
               if _fails(spec, lane, w))
    head = HeadStart(spec, threads, retry_remotely, [])
    handle = head.offer(window_graph(spec, *bad), 0)
    assert head.first_window.wait(30)
    sent = []

    def send(graph, priority):
        sent.append((graph.lane, graph.window))
        return SynchronousRunner(spec).submit(graph, priority)

    head.hand_over(send)
    with pytest.raises(error, match="bad record") as info:
        handle.result()
    notes = "\n".join(info.value.__notes__)
    assert f"lane {bad[0]}, window {bad[1]}" in notes and "offset 7" in notes
    assert sent == ([bad] if retry_remotely and error is ConnectionResetError else [])


def _fails(spec, lane, w) -> bool:
    try:
        compute_window(spec, lane, w)
    except (RuntimeError, OSError):
        return True
    return False


_COMPUTING = threading.Event()
_RELEASE = threading.Event()


def _held(rec):
    """Says a window is computing, then waits until the test releases it (a deadline: 60 s)."""
    _COMPUTING.set()
    _RELEASE.wait(60)
    return rec


def test_closing_fails_the_queued_windows_and_lets_the_one_computing_finish(corpus_dir):
    web = z.Dataset.from_jsonl("web", str(corpus_dir / "web"), progress=False)
    spec = (z.Pipeline(z.MixtureWorkSource([web], chunk_size=12, seed=1)).map(_held, version=1).tokenize()
            .pack(64).batch(2).options(canonical_replicas=2).spec)
    _COMPUTING.clear()
    _RELEASE.clear()
    head = HeadStart(spec, 1, True, [])
    pairs = _windows(spec, 3)
    try:
        handles = [head.offer(window_graph(spec, *pair), -i) for i, pair in enumerate(pairs)]
        assert _COMPUTING.wait(60)  # the first window is computing, held until the close
        head.close()
    finally:
        _RELEASE.set()
    assert head.offer(window_graph(spec, *pairs[0]), 0) is None
    assert same_window(handles[0].result(), compute_window(spec, *pairs[0]))
    for h in handles[1:]:
        with pytest.raises(ClosedError, match="closed while the window waited"):
            h.result()


def test_a_cluster_that_fails_to_start_fails_the_waiting_windows_promptly(corpus_dir, monkeypatch):
    def broken(*args, **kwargs):
        raise OSError("no free port")

    monkeypatch.setattr(runner_mod, "local_cluster", broken)
    # promptly: the start's own error, not the end of a wait as long as the test's timeout
    p = build(corpus_dir, n_workers=2, prefetch_windows=2, cluster_timeout=3600.0)
    with pytest.raises(OSError, match="no free port"), p:
        batches = iter(p)
        next(batches)  # the first batch taken: the start begins, and fails
        runner = p.session.runner()
        # else the head start may compute this small corpus first
        assert wait_for(lambda: not runner.starting, 60)
        list(batches)


def test_a_cluster_that_does_not_start_in_time_is_a_cluster_error(corpus_dir, monkeypatch):
    started, released = threading.Event(), threading.Event()

    def slow(*args, **kwargs):  # never starts before the test has seen the timeout
        started.set()
        released.wait(60)
        raise OSError("too late")

    monkeypatch.setattr(runner_mod, "local_cluster", slow)
    p = build(corpus_dir, n_workers=2, prefetch_windows=1, cluster_timeout=1.5)
    try:
        with pytest.raises(ClusterError, match="did not start within 1.5 s"):
            p.session.runner().worker_pids()
        assert started.is_set()
    finally:
        released.set()
        p.close()


def test_closing_while_the_cluster_starts_leaves_no_process(corpus_dir):
    before = child_pids()
    p = build(corpus_dir, n_workers=1)
    next(iter(p))  # the first window came from this process; the cluster may still be starting
    p.close()  # returns at once; the start going on ends in the background
    wait_until_no_new_processes(before)


def test_a_cluster_that_starts_after_close_gave_up_on_it_is_closed(corpus_dir, monkeypatch):
    real = runner_mod.local_cluster
    gave_up = threading.Event()

    def late(*args, **kwargs):  # starts only once the pipeline has given up on it and closed
        gave_up.wait(60)
        return real(*args, **kwargs)

    monkeypatch.setattr(runner_mod, "local_cluster", late)
    before = child_pids()
    p = build(corpus_dir, n_workers=1, cluster_timeout=1.0)
    next(iter(p))  # the first window, computed here, lets the start begin (a runner closed before starts nothing)
    with pytest.raises(ClusterError, match="did not start within 1 s"):
        p.session.runner().worker_pids()
    p.close()  # does not wait for the start
    gave_up.set()
    deadline = time.monotonic() + 30
    seen = False
    while time.monotonic() < deadline:
        now = child_pids() - before
        seen = seen or bool(now)
        if seen and not now:
            break
        time.sleep(0.2)
    assert seen and not (child_pids() - before)  # started late, then closed: nothing left


def test_the_embedded_cluster_starts_within_the_pipelines_cluster_timeout(corpus_dir, monkeypatch):
    asked = []

    def record(*args, **kwargs):
        asked.append(kwargs.get("timeout"))
        raise OSError("recorded")

    monkeypatch.setattr(runner_mod, "local_cluster", record)
    p = build(corpus_dir, n_workers=1, cluster_timeout=120.0)
    with pytest.raises(OSError, match="recorded"), p:
        p.session.runner().worker_pids()
    assert asked == [120.0]  # the scheduler process gets as long to start as the pipeline waits


_GATE = threading.Event()
_CALLS = [0]


def _held_after_one_chunk(record):
    """Lets the first chunk's 12 records through, then waits at the gate (a deadline: 60 s)."""
    _CALLS[0] += 1
    if _CALLS[0] > 12:
        _GATE.wait(60)
    return record


def test_a_window_computed_here_reports_its_chunks_as_they_finish(corpus_dir):
    """What the first batch's bar reads: chunk by chunk, not 0 until the whole window is done."""
    web = z.Dataset.from_jsonl("web", str(corpus_dir / "web"), progress=False)
    spec = (z.Pipeline(z.MixtureWorkSource([web], chunk_size=12, seed=1)).map(_held_after_one_chunk, version=1)
            .tokenize().pack(64).batch(2).options(canonical_replicas=2, flush_every_k_chunks=3).spec)
    _GATE.clear()
    _CALLS[0] = 0
    head = HeadStart(spec, 1, False, [])  # one thread: the window's chunks one after the other
    try:
        handle = head.offer(window_graph(spec, 0, 0, fused=True), 0)
        wait_for(lambda: handle.chunks_done() >= 1, 60)
        assert handle.chunks_done() == 1 and not handle.done()  # one chunk of three, held in the second
    finally:
        _GATE.set()
    assert same_window(handle.result(), compute_window(spec, 0, 0))
    assert handle.chunks_done() == 3
    head.close()


HOLD_S = 3.0  # how long the first window waits for a cluster start that must not come (longer than main's 1 s)
_HOLDS: dict[str, tuple[threading.Event, threading.Lock]] = {}  # name: (the cluster's start was called, taken by the record held)


class HoldFirstRecord:
    """A record operator whose first record (of any window) waits until the test sets the event
    ``_HOLDS[name][0]`` (the cluster's start was called), at most :data:`HOLD_S` s: a first window longer than a second unless the cluster's start
    competes with it. Named, so that one test's windows still computing never hold another's."""

    def __init__(self, name: str):
        self.name = name
        _HOLDS[name] = (threading.Event(), threading.Lock())

    def __call__(self, record):
        started, held = _HOLDS[self.name]
        if held.acquire(blocking=False):  # once
            started.wait(HOLD_S)
        return record


def _pipeline_with_slow_first_window(corpus_dir, name, **options):
    web = z.Dataset.from_jsonl("web", str(corpus_dir / "web"), progress=False)
    return (z.Pipeline(z.MixtureWorkSource([web], chunk_size=12, seed=1)).map(HoldFirstRecord(name), version=1)
            .tokenize().pack(64).batch(2).options(canonical_replicas=2, n_workers=1, **options))


def test_the_cluster_starts_only_once_the_first_window_is_computed_here(corpus_dir, monkeypatch):
    """The order of events: the first batch's window done here, then the cluster's start begun
    (its processes would take the cores that window needs); its deadline counts from then."""
    seen = []  # what this process had computed when the cluster's start was called

    def record(*args, **kwargs):
        seen.append(list(runner.computed_here))
        _HOLDS["order"][0].set()
        raise OSError("recorded")

    monkeypatch.setattr(runner_mod, "local_cluster", record)
    p = _pipeline_with_slow_first_window(corpus_dir, "order", cluster_timeout=1.0, stall_timeout=120.0)
    runner = p.session.runner()
    try:
        first = next(iter(p))  # its window took HOLD_S s, past cluster_timeout: no ClusterError
        wait_for(lambda: seen, 60, every=0.02)
    finally:
        _HOLDS["order"][0].set()
        p.close()
    assert first is not None
    # begun once, after lane 0's first window was computed here; other windows the head start went
    # on to compute before the start thread got to local_cluster (it imports distributed first) may follow it
    assert len(seen) == 1 and seen[0][:1] == [(0, 0)], seen


def test_the_cluster_starts_only_once_the_first_batch_is_cut(corpus_dir, monkeypatch):
    """The first window computed here, the cluster's start still waits for the consumer's cut of
    the first batch (its import of ``distributed`` would hold the GIL the cut needs)."""
    from zephon_dask.consumer import stream as stream_mod
    from zephon_dask.execution import head_start as head_start_mod

    started = threading.Event()
    at_cut: list[bool] = []  # whether the start had begun while the first batch was cut

    def record(*args, **kwargs):
        started.set()
        raise OSError("recorded")

    real_check = stream_mod.check_first_window

    def check(*args, **kwargs):  # a step of the cut, held: the start would begin meanwhile
        started.wait(2.0)
        at_cut.append(started.is_set())
        return real_check(*args, **kwargs)

    monkeypatch.setattr(runner_mod, "local_cluster", record)
    monkeypatch.setattr(stream_mod, "check_first_window", check)
    monkeypatch.setattr(head_start_mod, "CUT_AT_MOST", 120.0)
    p = build(corpus_dir)
    try:
        next(iter(p))
        assert started.wait(60)  # begun once the first batch was cut
    finally:
        p.close()
    assert at_cut == [False]


def test_a_first_window_no_batch_is_cut_from_lets_the_cluster_start(corpus_dir, monkeypatch):
    """The bound: a caller that takes no batch from the first window computed here (a stream
    opened, nothing read) has the cluster's start begin CUT_AT_MOST seconds after it."""
    from zephon_dask.execution import head_start as head_start_mod

    started = threading.Event()

    def record(*args, **kwargs):
        started.set()
        raise OSError("recorded")

    monkeypatch.setattr(runner_mod, "local_cluster", record)
    monkeypatch.setattr(head_start_mod, "CUT_AT_MOST", 0.2)
    p = build(corpus_dir)
    runner = p.session.runner()
    try:
        p.session.open_stream([0, 1], None)  # submits the first windows; no batch is cut
        assert started.wait(60)
        assert runner.computed_here[:1] == [(0, 0)]  # begun after the first window was computed here
    finally:
        p.close()


def test_a_first_window_that_makes_no_progress_lets_the_cluster_start(corpus_dir, monkeypatch):
    """The bound: no chunk of the first window done within ``stall_timeout``: the cluster's
    start begins while it still computes."""
    seen = []

    def record(*args, **kwargs):
        seen.append(list(runner.computed_here))
        _HOLDS["bound"][0].set()  # lets the held window go on
        raise OSError("recorded")

    monkeypatch.setattr(runner_mod, "local_cluster", record)
    p = _pipeline_with_slow_first_window(corpus_dir, "bound", stall_timeout=0.5)
    runner = p.session.runner()
    try:
        p.session.open_stream([0, 1], None)  # submits the first windows; nothing waits for them
        wait_for(lambda: seen, 60, every=0.02)
    finally:
        _HOLDS["bound"][0].set()
        p.close()
    assert seen == [[]]  # begun while the first window still computed here
