"""Execution on real runners and clusters never changes a byte of the data."""

from __future__ import annotations

import gc
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import zephon_dask as z
from tests.helpers.oracles import batch_rows, ref_group_stream
from tests.helpers.pipelines import build, child_pids, wait_until_no_new_processes
from zephon_dask.curriculum import group_lanes
from zephon_dask.errors import ElasticityWarning
from zephon_dask.pipeline.ranks import owned_lanes


def stream(pipeline):
    with pipeline:
        return [batch_rows(b) for b in pipeline]


def reference(pipeline):
    return ref_group_stream(pipeline.spec, owned_lanes(pipeline.description.settings), pipeline.description.batch.microbatch_size)


@pytest.fixture(scope="module")
def cluster():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as lc:
        with Client(lc, set_as_default=False) as client:
            yield client


@pytest.mark.parametrize("runner", ["synchronous", "threads"])
@pytest.mark.parametrize("prefetch", [1, 8])
@pytest.mark.parametrize("fuse", [False, True])
def test_local_runners_match_reference(corpus_dir, runner, prefetch, fuse):
    p = build(corpus_dir, runner=runner, prefetch_windows=prefetch, fuse=fuse)
    truth = reference(p)
    assert len(truth) > 10
    assert stream(p) == truth


@pytest.mark.parametrize("algorithm", ["block", "block_warmup"])
def test_block_shuffles_and_ensure_mixture_give_the_same_batches_on_every_runner(corpus_dir, cluster, algorithm):
    def shuffled(**options):
        web = z.Dataset.from_jsonl("web", str(corpus_dir / "web"), progress=False)
        code = z.Dataset.from_jsonl("code", str(corpus_dir / "code"), progress=False)
        ws = z.MixtureWorkSource([web, code], {"web": 3, "code": 1}, chunk_size=12, seed=7)
        return z.Pipeline(ws).filter(lambda r: len(r["text"]) % 3 > 0).tokenize() \
            .shuffle(10, algorithm=algorithm).ensure_mixture(strict=algorithm == "block", buffer_size=5) \
            .pack(96, algorithm="first_fit").batch(3).options(canonical_replicas=4, flush_every_k_chunks=2, **options)

    truth = reference(shuffled(runner="synchronous"))
    assert len(truth) > 10
    assert truth != reference(build(corpus_dir, seed=7))  # the shuffle changed the order
    for options in (dict(runner="synchronous"), dict(runner="threads", prefetch_windows=5),
                    dict(client=cluster, prefetch_windows=3), dict(client=cluster, dp_degree=2, dp_group_id=1)):
        p = shuffled(**options)
        got = stream(p)
        assert got == reference(p), options
        if "dp_degree" not in options:
            assert got == truth, options


def test_choose_runner_and_make_runner_agree(corpus_dir):
    from zephon_dask.errors import ConfigError
    from zephon_dask.execution import choose_runner, make_runner
    from zephon_dask.execution.local import ThreadRunner

    base = {"runner": "threads", "client": None, "address": None}
    assert choose_runner(base) == "threads"
    assert choose_runner({**base, "address": "tcp://127.0.0.1:1"}) == "distributed"
    assert choose_runner({**base, "client": object()}) == "distributed"
    spec = build(corpus_dir).spec
    runner = make_runner(spec, {**base, "n_workers": 3})
    try:
        assert type(runner) is ThreadRunner and runner.n_workers == 3
    finally:
        runner.close()
    assert make_runner(spec, {**base, "runner": "synchronous"}).name == "synchronous"
    with pytest.raises(ConfigError, match="'distributed', 'threads', 'synchronous'"):
        make_runner(spec, {**base, "runner": "gpu"})


def test_embedded_local_cluster_one_worker_and_close(corpus_dir):
    before = child_pids()
    p = build(corpus_dir, n_workers=1, prefetch_windows=2)
    truth = reference(p)
    got = []
    with p:
        for b in p:
            got.append(batch_rows(b))
        assert "distributed" in p.session.runner().describe()
    assert got == truth
    wait_until_no_new_processes(before)  # no worker process left behind (a start still running ends)


def _worker_settings():
    import dask

    return (os.environ.get("MALLOC_TRIM_THRESHOLD_"), os.environ.get("MALLOC_ARENA_MAX"),
            dask.config.get("distributed.admin.tick.interval"), dask.config.get("distributed.worker.profile.interval"))


def _worker_log_bounds(dask_worker):
    return (dask_worker.profile_history.maxlen, dask_worker.state.log.maxlen, dask_worker.monitor.maxlen)


def _scheduler_log_bounds(dask_scheduler):
    return dask_scheduler.transition_log.maxlen, dask_scheduler.monitor.maxlen


def test_embedded_cluster_settings_spare_the_training_cores_unless_the_user_set_them(corpus_dir, monkeypatch):
    """The embedded cluster's Dask settings (its workers' environment, its ticks, its bounded logs),
    each kept as the user set it; one cluster with the defaults, one with the user's."""
    import dask

    # Dask's default MALLOC_TRIM_THRESHOLD_=65536 made tokenize + pack ~20% slower in a worker
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    # one glibc arena per worker, so its periodic trim reaches all of the worker's free memory
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    with build(corpus_dir, n_workers=1) as p:
        next(iter(p))
        client = p.session.runner().client
        got = client.run(_worker_settings)
        # Dask's 1,000 one-second profile cycles (kept twice) grew a streaming worker by 24-32 MB over 17 minutes
        assert list(client.run(_worker_log_bounds).values()) == [(300, 300, 300)]
        assert client.run_on_scheduler(_scheduler_log_bounds) == (300, 300)
    assert list(got.values()) == [(None, "1", "1s", "1s")]
    # nor is this process's environment changed
    assert "MALLOC_TRIM_THRESHOLD_" not in os.environ and "MALLOC_ARENA_MAX" not in os.environ
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    users = {"distributed.worker.profile.interval": "20ms", "distributed.admin.low-level-log-length": 50}
    with dask.config.set(users), build(corpus_dir, n_workers=1) as p:
        next(iter(p))
        client = p.session.runner().client
        got = client.run(_worker_settings)
        assert list(client.run(_worker_log_bounds).values()) == [(50, 50, 300)]
        assert client.run_on_scheduler(_scheduler_log_bounds) == (50, 300)
    assert list(got.values()) == [(None, "4", "1s", "20ms")]


def test_connect_starts_an_embedded_cluster_with_its_settings():
    """``connect()`` (``prepare_tokens``) starts the same embedded cluster as the runner."""
    from zephon_dask.execution.connect import connect

    with connect(n_workers=1) as client:
        assert list(client.run(_worker_log_bounds).values()) == [(300, 300, 300)]
        assert client.run_on_scheduler(_scheduler_log_bounds) == (300, 300)


def _plugins(dask_worker=None):
    return sorted(dask_worker.plugins)


def test_embedded_cluster_workers_and_the_consumer_give_freed_memory_back(corpus_dir, monkeypatch):
    from zephon_dask.execution import memory
    from zephon_dask.execution.plugins import TrimFreedMemory

    assert memory.trim_freed_memory()  # glibc on the machines we test on
    with build(corpus_dir, n_workers=1) as p:
        next(iter(p))
        assert TrimFreedMemory.name in next(iter(p.session.runner().client.run(_plugins).values()))
    trims = []
    monkeypatch.setattr(memory, "trim_freed_memory", lambda: trims.append(1) or True)
    now = [100.0]
    trimmer = memory.Trimmer(every=0.2, clock=lambda: now[0])
    now[0] += 0.19
    trimmer.maybe()
    assert trims == []  # not before its interval
    now[0] += 0.01
    trimmer.maybe()
    trimmer.maybe()
    assert trims == [1]  # once per interval


def test_workers_trim_between_tasks_at_most_once_a_second(monkeypatch):
    from zephon_dask.execution import plugins

    trims = []
    monkeypatch.setattr(plugins, "trim_freed_memory", lambda: trims.append(1) or True)
    plugin = plugins.TrimFreedMemory()
    plugin.transition("k", "executing", "memory")
    plugin.transition("k", "ready", "executing")  # a task starting: no trim
    plugin.transition("k2", "executing", "memory")  # within the second: no trim
    assert trims == [1]
    plugin._trimmed -= plugins.TRIM_AFTER_TASK_EVERY
    plugin.transition("k2", "executing", "error")
    assert trims == [1, 1]
    every_task = plugins.TrimFreedMemory(after_task_every=0.0)  # the interval is the plugin's own
    every_task.transition("k", "executing", "memory")
    every_task.transition("k2", "executing", "memory")
    assert trims == [1, 1, 1, 1]


def test_windows_computed_ahead_wait_in_the_training_process_not_on_the_workers(corpus_dir, cluster):
    """A window's result is fetched as soon as it is computed and the cluster's copy released, so
    the workers hold no finished window while the consumer is busy; the batches are unchanged."""
    p = build(corpus_dir, client=cluster, prefetch_windows=6, windows_per_task=1)
    truth = reference(p)
    with p:
        it = iter(p)
        got = [batch_rows(next(it))]
        handles = list(p.session.stream.fetcher.inflight.values())
        deadline = time.monotonic() + 60
        while sum(h.fetched for h in handles) < 3:
            assert time.monotonic() < deadline, "no window fetched ahead"
            time.sleep(0.05)
        fetched = set().union(*(h.keys for h in handles if h.fetched))
        assert all(h.held_nbytes > 0 for h in handles if h.fetched)
        deadline = time.monotonic() + 30
        while held := {k for k, workers in cluster.who_has(list(fetched)).items() if workers}:
            assert time.monotonic() < deadline, f"still held on the workers: {held}"
            time.sleep(0.05)
        got += [batch_rows(b) for b in it]
    assert got == truth


def _scheduler_records(dask_scheduler, trim=False):
    from dask.utils import key_split

    from zephon_dask.execution.plugins import TrimSchedulerRecords
    from zephon_dask.execution.runner import SPAN_NAME

    if trim:
        TrimSchedulerRecords.trim(dask_scheduler, SPAN_NAME, keep=1, quiet=0)
    spans = dask_scheduler.extensions["spans"].spans.values()
    ours = [s for s in spans if s.name == SPAN_NAME]
    dead_groups = sum(dask_scheduler.task_groups.get(tg.name) is not tg for s in ours for tg in s.groups)
    return (sorted(dask_scheduler.plugins), key_split.cache_info().currsize,
            sum(len((s.metadata or {}).get("collections", ())) for s in spans), len(spans), len(ours),
            dead_groups, len(dask_scheduler.computations), dask_scheduler.computations.maxlen)


def _span_ids_in_worker_metrics(dask_worker):
    return sorted({k[1] for k in dask_worker.digests_total if isinstance(k, tuple) and k[0] == "execute"})


def test_embedded_cluster_keeps_dasks_per_window_records_bounded(corpus_dir):
    # Dask keeps every key's name prefix (up to 100,000) and one collection entry per submitted
    # graph in the scheduler (without end); the client kept its last 1,000 messages; a span, and
    # a worker's metrics for it, per idle spell (a new default span each time every task was
    # done), never dropped, each listing its task groups
    from zephon_dask.execution.plugins import TrimSchedulerRecords

    with build(corpus_dir, n_workers=1, head_start=False) as p:
        for _ in range(3):  # every task done between two passes
            assert len(list(p)) > 4
        client = p.session.runner().client
        assert client.scheduler_comm.recent_message_log.maxlen == 300
        plugins, names, collections, spans, ours, dead, computations, kept = client.run_on_scheduler(_scheduler_records)
        assert TrimSchedulerRecords.name in plugins  # it trims every 30 s: sizes depend on when it last ran
        assert ours == 1 and spans <= 2 and kept == 10 and computations <= kept
        (span_ids,) = client.run(_span_ids_in_worker_metrics).values()
        assert len(span_ids) == 1 and span_ids[0].startswith("zephon-dask-"), span_ids
        _, names, collections, spans, ours, dead, _, _ = client.run_on_scheduler(_scheduler_records, trim=True)
        # one distinct entry per kind of graph: a window's, a several-window task's, the spec's future
        assert names == 0 and collections <= 3
        assert ours == 1 and spans <= 2 and dead == 0


def test_malloc_in_use_counts_live_allocations_not_freed_memory():
    from zephon_dask.execution import memory

    before = memory.malloc_in_use()  # glibc on the machines we test on
    block = bytearray(64 * 2**20)
    during = memory.malloc_in_use()
    del block
    after = memory.malloc_in_use()
    # other threads (a client's event loop from an earlier test) may free or allocate a little meanwhile
    assert during - before >= 60 * 2**20 and after - before < 8 * 2**20, (before, during, after)


def test_python_small_objects_counts_live_objects_within_the_arenas_held():
    from zephon_dask.execution import memory

    live0, arenas0 = memory.python_small_objects()  # CPython's pymalloc on the machines we test on
    objects = [str(i) for i in range(500_000)]  # ~30 MB of small objects
    live1, arenas1 = memory.python_small_objects()
    del objects
    live2, _ = memory.python_small_objects()
    assert live1 - live0 >= 20 * 2**20 and arenas1 >= live1 and abs(live2 - live0) < 4 * 2**20, (live0, live1, live2)
    assert memory.allocator_stats()[0] is not None  # malloc in use, asked with them in one call


def test_starting_the_embedded_cluster_leaves_this_process_environment_as_it_was(corpus_dir, monkeypatch):
    # the nanny exports OMP_NUM_THREADS=1, PYTHONHASHSEED, ... into the spawning process; every
    # process the training script started afterwards inherited them
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "PYTHONHASHSEED"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("ZEPHON_TEST_KEPT", "yes")
    before = dict(os.environ)
    with build(corpus_dir, n_workers=1) as p:
        next(iter(p))
        assert dict(os.environ) == before
        worker_env = list(p.session.runner().client.run(lambda: os.environ.get("OMP_NUM_THREADS")).values())
    assert worker_env == ["1"]  # the workers still get theirs
    assert dict(os.environ) == before


def test_prefetch_defaults_to_two_windows_per_slot_plus_four(corpus_dir):
    p = build(corpus_dir, runner="threads", n_workers=3)
    assert "auto: 2 per worker thread + 4" in str(p.explain())
    it = iter(p)
    next(it)
    assert p.session.stream.fetcher.prefetch == 10
    assert "auto: 10" in str(p.explain())
    p.close()
    p = p.options(prefetch_windows=1)
    next(iter(p))
    assert p.session.stream.fetcher.prefetch == 1
    p.close()


UNGUARDED_SCRIPT = """
import hashlib, json, sys
import torch  # a training script's imports: the embedded cluster's workers must not repeat them
import zephon_dask as z

class Shout:  # a tokenizer defined in the script itself
    def __call__(self, text):
        return list(text.upper().encode())

def exclaim(rec):  # so is this map function
    return {**rec, "text": rec["text"] + "!"}

def build(**options):
    ds = z.Dataset.from_jsonl("web", sys.argv[1], progress=False)
    return (z.Pipeline(z.MixtureWorkSource([ds], chunk_size=12, seed=1)).map(exclaim, version=1)
            .tokenize(Shout(), eos_id=0, name="shout", version=1).pack(64).batch(2)
            .options(canonical_replicas=2, flush_every_k_chunks=2, **options))

def digest(pipeline):
    h = hashlib.sha256()
    for batch in pipeline:
        h.update(batch["tokens"].tobytes())
    return h.hexdigest()

truth = digest(build(runner="synchronous"))
with build(n_workers=1) as p:  # no `if __name__ == "__main__":` guard anywhere
    got = digest(p)
    torch_in_workers = list(p.session.runner().client.run(lambda: "torch" in sys.modules).values())
print(json.dumps({"same": got == truth, "torch_in_workers": torch_in_workers, "file": __file__}))
"""


def test_embedded_cluster_workers_do_not_rerun_the_training_script(corpus_dir, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(UNGUARDED_SCRIPT)
    before = child_pids()
    out = subprocess.run([sys.executable, str(script), str(corpus_dir / "web")], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"same": True, "torch_in_workers": [False], "file": str(script)}
    assert child_pids() <= before


def test_garbage_collection_stops_the_cluster(corpus_dir):
    before = child_pids()
    p = build(corpus_dir, n_workers=1)
    next(iter(p))
    p.session.runner().worker_pids()  # the cluster has started (the first windows may come from this process)
    assert child_pids() - before
    del p
    gc.collect()
    deadline = time.time() + 20
    while child_pids() - before and time.time() < deadline:
        time.sleep(0.2)
    assert not (child_pids() - before)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    prefetch=st.integers(1, 8), fuse=st.booleans(), seed=st.integers(0, 1000),
    prefetch_bytes=st.sampled_from([None, 1, 100_000, 2**30]),
    degree=st.sampled_from([1, 2, 4]), mapping=st.sampled_from(["contiguous", "interleaved"]),
    microbatch=st.integers(1, 5), algorithm=st.sampled_from(["wrap", "first_fit", "best_fit"]),
)
def test_two_worker_cluster_matches_reference(corpus_dir, cluster, prefetch, fuse, seed, prefetch_bytes, degree,
                                              mapping, microbatch, algorithm):
    group = seed % degree
    p = build(corpus_dir, seed=seed, microbatch=microbatch, algorithm=algorithm, client=cluster,
              prefetch_windows=prefetch, prefetch_bytes=prefetch_bytes, fuse=fuse, dp_degree=degree, dp_group_id=group, mapping_strategy=mapping)
    assert stream(p) == reference(p)


def test_killed_worker_changes_nothing(corpus_dir):
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as lc, \
            Client(lc, set_as_default=False) as client:
        p = build(corpus_dir, client=client, prefetch_windows=8, retries=0)
        truth = reference(p)
        it = iter(p)
        got = [batch_rows(next(it))]
        victim = next(iter(client.run(os.getpid).values()))
        os.kill(victim, signal.SIGKILL)
        got += [batch_rows(b) for b in it]
        p.close()
        assert got == truth


def _scheduler_tasks(fp: str, dask_scheduler=None) -> dict:
    """The scheduler's tasks whose key holds ``fp``: ``{key: (dependencies, group, user priority,
    worker restrictions)}``."""
    return {str(k): (sorted(str(d.key) for d in ts.dependencies), ts.prefix.name, -ts.priority[0],
                     tuple(sorted(ts.worker_restrictions or ())))
            for k, ts in dask_scheduler.tasks.items() if fp in str(k)}


@pytest.mark.parametrize("fuse", [False, True])
def test_distributed_runner_submits_exactly_the_window_graph(corpus_dir, cluster, fuse):
    import dask

    from zephon_dask.execution.runner import ClusterSettings, DistributedRunner
    from zephon_dask.graph import window_graph

    spec = build(corpus_dir, seed=77).spec  # a fingerprint no other test submits
    fp = spec.fingerprint[:16]
    graph = window_graph(spec, 1, 0, fuse)
    whole = graph.to_dict(spec)
    runner = DistributedRunner(spec, ClusterSettings(client=cluster))
    handle = runner.submit(graph, priority=7)
    assert handle.result().digest() == dask.get(whole, graph.key).digest()
    seen = cluster.run_on_scheduler(_scheduler_tasks, fp)
    assert {k: deps for k, (deps, *_) in seen.items()} == {k: sorted(n.dependencies) for k, n in whole.items()}
    groups = {"zephon-spec", "zephon-fused-window"} if fuse else {"zephon-spec", "zephon-chunk", "zephon-window"}
    assert {group for _, group, _, _ in seen.values()} == groups  # what the dashboard shows
    assert {seen[k][2:] for k in graph.task_keys} == {(7, ())}
    handle.release()

    # a silent worker: the spec by value, every task kept off the other workers; a stalled window's copy
    worker = sorted(cluster.scheduler_info()["workers"])[0]
    copy = graph.fused_copy(1)
    runner._live_only = ([worker], time.monotonic() + 60)  # (the responsive workers, until)
    handles = [runner.submit(graph, priority=3)]
    handles.append(runner.submit_tasks(copy, spec, 3, None, workers=[worker], allow_other_workers=False)[0])
    for h in handles:
        h.result()
    seen = cluster.run_on_scheduler(_scheduler_tasks, fp)
    expected = {k: (sorted(d for d in n.dependencies if d != graph.spec_key), 3, (worker,))
                for k, n in {**graph.tasks_for(spec), **copy.tasks_for(spec)}.items()}
    assert {k: (deps, *rest) for k, (deps, _, *rest) in seen.items() if k != graph.spec_key} == expected
    assert seen[copy.key][1] == "zephon-again-" + ("fused-window" if fuse else "window")
    for h in handles:
        h.release()
    runner.close()
    deadline = time.time() + 20
    while cluster.run_on_scheduler(_scheduler_tasks, fp) and time.time() < deadline:
        time.sleep(0.1)
    assert cluster.run_on_scheduler(_scheduler_tasks, fp) == {}  # every future released


def _stored(key: str, dask_scheduler=None) -> int | None:
    """The bytes a worker holds for ``key`` (what the dashboard counts as managed), once computed."""
    ts = dask_scheduler.tasks.get(key)
    return ts.nbytes if ts is not None and ts.state == "memory" else None


def test_windows_are_held_narrowed_on_the_workers_and_here(corpus_dir, cluster):
    """A window's result is held in its smallest integer types on its worker, in transfer and
    here; widened, it is the window as computed, byte for byte."""
    import numpy as np

    from zephon_dask.core.window import compute_window
    from zephon_dask.execution.runner import ClusterSettings, DistributedRunner
    from zephon_dask.graph import window_graph

    spec = build(corpus_dir, seed=79).spec  # a fingerprint no other test submits
    wide = compute_window(spec, 1, 0)
    runner = DistributedRunner(spec, ClusterSettings(client=cluster))
    runner.fetch_ahead = False  # the worker keeps it until it is fetched
    try:
        graph = window_graph(spec, 1, 0, True)
        handle = runner.submit(graph, priority=0)
        deadline = time.monotonic() + 60
        while (stored := cluster.run_on_scheduler(_stored, graph.key)) is None:
            assert time.monotonic() < deadline, "the window was not computed"
            time.sleep(0.05)
        out = handle.result()
        handle.release()
    finally:
        runner.close()
    assert out.table.tokens.dtype.itemsize <= 2 and out.wide["tokens"] == np.int32 and wide.table.tokens.dtype == np.int32
    assert stored < 0.6 * wide.__sizeof__() and out.__sizeof__() < 0.6 * wide.__sizeof__()
    assert out.digest() == wide.digest() and out.widened().table.digest() == wide.table.digest()


def test_prefetch_bytes_bounds_the_windows_in_flight(corpus_dir):
    """``prefetch_bytes`` keeps no more windows in flight than fit in it at the mean size of
    those taken (at least one); the batches are the same."""
    # every sample: the first window taken is then the first batch's (with drop_last_step a packed
    # stream takes every lane's first window before its first step, and the first count below is 4)
    p = build(corpus_dir, runner="threads", n_workers=2, prefetch_windows=8, prefetch_bytes=1, drop_last_step=False)
    truth = reference(p)
    got, in_flight = [], []
    with p:
        for b in p:
            got.append(batch_rows(b))
            fetcher = p.session.stream.fetcher
            if fetcher.taken:  # the size of a window is known: no window submitted past the bound
                in_flight.append(len(fetcher.inflight))
        assert fetcher.room() == 1
        fetcher.prefetch_bytes = int(2.5 * fetcher.taken_bytes / fetcher.taken)
        assert fetcher.room() == 2
    assert got == truth
    assert in_flight[0] == 7 and in_flight == sorted(in_flight, reverse=True) and in_flight[-1] <= 1


def test_only_as_many_first_and_last_windows_as_workers_are_split(corpus_dir, cluster):
    """With ``fuse``, the first windows of an iteration, one per lane, are split into chunk tasks for
    the first 2 lanes (the cluster's 2 worker threads compute each together) and fused for the
    others, and so are the iteration's last 2 windows (the workers share its end chunk by chunk
    instead of one computing the last window alone); again on the next iteration. The bytes are
    the reference's."""
    from distributed import get_task_stream

    p = build(corpus_dir, seed=78, R=4, client=cluster)  # a fingerprint no other test submits
    fp = p.spec.fingerprint[:16]
    order = sorted((w, lane) for lane in range(4) for w in range(p.spec.num_windows(lane)))
    last = {(lane, w) for w, lane in order[-2:]}  # submitted window by window, lane by lane
    assert len(order) > 6 and not last & {(0, 0), (1, 0), (2, 0), (3, 0)}
    with p:
        for _ in range(2):
            with get_task_stream(client=cluster) as ts:
                got = [batch_rows(b) for b in p]
            assert got == reference(p)
            keys = [t["key"] for t in ts.data if fp in str(t["key"])]
            split = {tuple(map(int, k.split("-")[-3:-1])) for k in keys if k.startswith("zephon-chunk-")}
            fused = {tuple(map(int, k.split("-")[-2:])) for k in keys if k.startswith("zephon-fused-window-")}
            fused |= {tuple(map(int, m.split("."))) for k in keys if k.startswith("zephon-windows-")
                      for m in k.split("-")[3:]}  # tasks of several fused windows
            assert split == {(0, 0), (1, 0)} | last
            assert {(2, 0), (3, 0)} <= fused and not split & fused


def _queued_in_priority_order(fp: str, dask_scheduler=None) -> dict:
    """``{key: whether the scheduler treats the task as root-ish}`` for the tasks whose key holds
    ``fp`` (root-ish tasks wait in one queue and go to the workers in priority order)."""
    return {str(k): dask_scheduler.is_rootish(ts) for k, ts in dask_scheduler.tasks.items() if fp in str(k)}


def test_window_tasks_are_queued_in_priority_order_however_few(corpus_dir, cluster):
    """The tasks that read data (a fused window, a split window's chunks) are queued by Dask's
    scheduler and handed to workers in priority order even when there are few of them: Dask
    queues only groups much larger than the cluster otherwise, so at an iteration's start a
    few fused windows went straight to the workers while the first window's chunks waited
    behind them. A split window's last task (it has dependencies) is not queued."""
    from zephon_dask.execution.runner import ClusterSettings, DistributedRunner
    from zephon_dask.graph import window_graph

    spec = build(corpus_dir, seed=79, k=4).spec  # a fingerprint no other test submits
    runner = DistributedRunner(spec, ClusterSettings(client=cluster))
    split, fused = window_graph(spec, 0, 0, fused=False), window_graph(spec, 1, 0, fused=True)
    runner.fetch_ahead = False  # its results stay held, not released: the scheduler still has every task
    handles = [runner.submit(split, priority=0), runner.submit(fused, priority=-1)]
    for h in handles:
        h.result()
    seen = cluster.run_on_scheduler(_queued_in_priority_order, spec.fingerprint[:16])
    for h in handles:
        h.release()
    runner.close()
    assert {k: seen[k] for k in [*split.task_keys, fused.key]} == {**dict.fromkeys(split.chunk_keys, True),
                                                                 split.key: False, fused.key: True}


def test_two_pipelines_share_keys_on_one_cluster(corpus_dir, cluster):
    a = build(corpus_dir, client=cluster, prefetch_windows=64, dp_degree=2, dp_group_id=1)
    b = build(corpus_dir, client=cluster, prefetch_windows=64, dp_degree=2, dp_group_id=1)
    from distributed import get_task_stream

    with get_task_stream(client=cluster) as ts:
        ia, ib = iter(a), iter(b)  # both submit every window before either gathers
        got_a = [batch_rows(x) for x in ia]
        got_b = [batch_rows(x) for x in ib]
    a.close(), b.close()
    assert got_a == got_b == reference(a)
    window_runs = Counter(t["key"] for t in ts.data if "window" in str(t["key"]))
    assert window_runs and set(window_runs.values()) == {1}  # each shared key computed once


@pytest.mark.parametrize("mapping", ["contiguous", "interleaved"])
def test_union_over_dp_groups_is_topology_independent(corpus_dir, mapping):
    def collect(degree):
        items, orders = [], []
        for group in range(degree):
            # every sample: a packed stream's pass otherwise ends on each group's own last whole step
            p = build(corpus_dir, R=8, runner="synchronous", dp_degree=degree, dp_group_id=group,
                      mapping_strategy=mapping, drop_last_step=False)
            got = stream(p)
            items += [(lane, idx, json.dumps(rows)) for lane, idx, rows in got]
            orders.append((group_lanes(8, degree, mapping)[group], [lane for lane, _, _ in got]))
        return Counter(items), orders

    truth, _ = collect(1)
    for degree in (2, 4, 8):
        got, orders = collect(degree)
        assert got == truth
        for lanes, emitted in orders:  # strict round-robin while every lane is active
            n = min(Counter(emitted).values()) * len(lanes)
            assert emitted[:n] == lanes * (n // len(lanes))


def test_non_deterministic_mode_delivers_the_same_batches(corpus_dir):
    p = build(corpus_dir, runner="threads", deterministic=False, prefetch_windows=4)
    assert Counter(json.dumps(x) for x in stream(p)) == Counter(json.dumps(x) for x in reference(p))


def test_errors_reach_the_loop_with_their_pointer(corpus_dir, cluster):
    def explode(rec):
        if "web 1/7 " in rec["text"]:
            raise RuntimeError("bad record")
        return rec

    for opts in ({"runner": "threads"}, {"client": cluster}):
        web = z.Dataset.from_jsonl("web", str(corpus_dir / "web"), progress=False)
        ws = z.MixtureWorkSource([web], chunk_size=12, seed=1)
        p = z.Pipeline(ws).map(explode).tokenize().pack(64).batch(2).options(canonical_replicas=2, **opts)
        with pytest.raises(RuntimeError, match="bad record") as info, p:
            list(p)
        notes = "\n".join(getattr(info.value, "__notes__", []))
        assert "dataset 'web', shard 1, offset 7" in notes
        assert "lane " in notes and "window " in notes


def test_to_torch_matches_batches(corpus_dir):
    import torch

    p = build(corpus_dir, runner="synchronous")
    truth = [b for b in p]
    got = list(build(corpus_dir, runner="synchronous").to_torch(device="cpu", prefetch=3))
    assert len(got) == len(truth)
    for t, b in zip(got, truth):
        assert t["tokens"].dtype == torch.int64
        assert torch.equal(t["tokens"], torch.from_numpy(b["tokens"]))
        assert torch.equal(t["document_ids"], torch.from_numpy(b["document_ids"]))


@pytest.mark.parametrize("num_workers", [0, 2, 3])
def test_dataloader_workers_replay_round_robin(corpus_dir, num_workers):
    import torch
    from torch.utils.data import DataLoader

    p = build(corpus_dir, runner="threads", drop_last_step=False)  # a loader of one's own: each worker's end
    truth = reference(p)
    loader = DataLoader(p.to_torch_dataset(), batch_size=None, num_workers=num_workers)
    got = []
    for t in loader:
        rows = [row[:n].tolist() for row, n in zip(t["tokens"], t["lengths"])]
        got.append((int(t["lane"]), int(t["index_in_lane"]), rows))
    p.close()
    assert Counter(json.dumps(x) for x in got) == Counter(json.dumps(x) for x in truth)
    lanes = [lane for lane, _, _ in truth]
    first_end = min(len(lanes) - lanes[::-1].index(lane) - 1 for lane in set(lanes))
    assert got[: first_end + 1] == truth[: first_end + 1]  # identical while every lane is active
    assert isinstance(t["tokens"], torch.Tensor)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def address_cluster():
    """A real ``dask scheduler`` and two ``dask worker`` processes on 127.0.0.1."""
    dask_bin = shutil.which("dask", path=os.path.dirname(sys.executable)) or shutil.which("dask")
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    procs = [subprocess.Popen([dask_bin, "scheduler", "--host", "127.0.0.1", "--port", str(port),
                               "--dashboard-address", ":0", "--no-show"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        from distributed import Client

        for _ in range(2):
            procs.append(subprocess.Popen([dask_bin, "worker", address, "--nthreads", "1", "--nworkers", "1",
                                           "--no-dashboard", "--host", "127.0.0.1"],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        with Client(address, timeout=30, set_as_default=False) as c:
            c.wait_for_workers(2, timeout=60)
        yield address
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_cluster_by_address_matches_reference(corpus_dir, address_cluster):
    p = build(corpus_dir, address=address_cluster, prefetch_windows=3)
    assert stream(p) == reference(p)


def test_degree_warning_and_identity_errors(corpus_dir):
    with pytest.warns(ElasticityWarning):
        owned_lanes(build(corpus_dir, dp_degree=3, dp_group_id=0).description.settings)
    with pytest.raises(z.ConfigError, match="dp_group_id=2 must be < dp_degree=2"):
        owned_lanes(build(corpus_dir, dp_degree=2, dp_group_id=2).description.settings)
    with pytest.raises(z.ConfigError, match="runner='spark'"):
        build(corpus_dir, runner="spark")
