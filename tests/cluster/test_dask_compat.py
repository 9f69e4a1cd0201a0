"""One test per private Dask API or undocumented behaviour the library relies on (each item of
``zephon_dask/execution/dask_compat.py`` names its test): a Dask release that changes one fails
here, by name. On an in-process cluster (one thread worker) or in a fresh interpreter."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time

import dask
import pytest
from distributed import Client, LocalCluster

from zephon_dask.execution import dask_compat

OURS = ("zephon-dask-compat-test",)
RELEASE = threading.Event()  # the slow task of a test returns once this is set (threads share it)


def _slow(deadline_s: float = 60.0) -> str:
    RELEASE.wait(deadline_s)
    return "slow"


def _fast(x):
    return x


@pytest.fixture(scope="module")
def client():
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address="127.0.0.1:0") as cluster, \
            Client(cluster, set_as_default=False) as c:
        yield c


def _rootish(keys, dask_scheduler=None) -> dict:
    return {k: dask_scheduler.is_rootish(dask_scheduler.tasks[k]) for k in keys}


def test_producer_task_is_queued_by_the_scheduler(client):
    """``Task(_data_producer=True)``: the scheduler treats the task as root-ish (queued, handed out in
    priority order) although its group is small; an unmarked one in a small group is not."""
    tasks = {"zcompat-producer-1": dask_compat.task("zcompat-producer-1", _fast, 1, producer=True),
             "zcompat-plain-1": dask_compat.task("zcompat-plain-1", _fast, 2)}
    assert tasks["zcompat-producer-1"].data_producer and not tasks["zcompat-plain-1"].data_producer
    futures = dask_compat.submit_graph(client, tasks, list(tasks), "zcompat-producer-graph")
    assert [f.result(timeout=30) for f in futures] == [1, 2]
    assert client.run_on_scheduler(_rootish, list(tasks)) == {"zcompat-producer-1": True, "zcompat-plain-1": False}
    client.cancel(futures)


class Untokenizable:
    """An argument that refuses to be tokenized (and is still picklable)."""

    def __dask_tokenize__(self):
        raise AssertionError("tokenized")


def test_a_graph_submitted_under_a_name_is_not_tokenized(client):
    """``LLGExpr(..., _determ_token=)``: a graph named by its key is not tokenized on the submitting
    thread (``Client.get`` with a plain dict is: that is what the name saves)."""
    task = dask_compat.task("zcompat-named-1", _fast, Untokenizable())
    with pytest.raises(AssertionError, match="tokenized"):
        client.get({"zcompat-named-1": task}, ["zcompat-named-1"], sync=False)
    (future,) = dask_compat.submit_graph(client, {"zcompat-named-1": task}, ["zcompat-named-1"], "zcompat-named-1",
                                         priority=3, fifo_timeout="100 ms")
    assert future.key == "zcompat-named-1" and isinstance(future.result(timeout=30), Untokenizable)
    client.cancel([future])


def test_wait_first_returns_at_the_first_done_future(client):
    """``distributed.client._wait`` (first completed, a timeout) for a client that is not the
    default, and as a coroutine on the client's loop."""
    RELEASE.clear()
    slow = client.submit(_slow, key="zcompat-slow-1", pure=False)
    with pytest.raises(TimeoutError):
        dask_compat.wait_first(client, [slow], 0.2, 10.0)
    fast = client.submit(_fast, 5, key="zcompat-fast-1", pure=False, workers=None)
    RELEASE.set()  # one worker thread: the fast task runs once the slow one returns
    deadline = time.monotonic() + 30
    while not (slow.done() or fast.done()):
        assert time.monotonic() < deadline
        try:
            dask_compat.wait_first(client, [slow, fast], 1.0, 10.0)
        except TimeoutError:
            pass
    client.sync(dask_compat.until_done, [slow, fast], callback_timeout=30)
    assert slow.result() == "slow" and fast.result() == 5
    client.cancel([slow, fast])


def test_scheduler_queries_answer_in_the_shape_read(client):
    """The scheduler's ``identity``, ``processing`` and ``who_has`` handlers, each with a deadline."""
    RELEASE.clear()
    held = client.submit(_fast, 7, key="zcompat-held-1", pure=False)
    busy = client.submit(_slow, key="zcompat-busy-1", pure=False)
    assert held.result(timeout=30) == 7
    info = dask_compat.identity(client, -1, 5.0)
    (worker,) = info["workers"]
    assert info["n_workers"] == 1 and info["total_threads"] == 1 and info["workers"][worker]["last_seen"] > 0
    assert dask_compat.identity(client, 0, 5.0)["workers"] == {}
    deadline = time.monotonic() + 30
    while "zcompat-busy-1" not in map(str, dask_compat.processing(client, 5.0).get(worker, [])):
        assert time.monotonic() < deadline, "the slow task never showed as processing"
        time.sleep(0.05)
    assert dask_compat.who_has(client, ["zcompat-held-1"], 5.0) == {"zcompat-held-1": [worker]}
    RELEASE.set()
    assert busy.result(timeout=30) == "slow"
    client.cancel([held, busy])


def test_first_value_is_the_first_clients(client):
    """The scheduler's ``task_metadata`` keeps the first value stored under a key: a second client
    asking with another value gets the first one's; another key is its own."""
    with Client(client.scheduler.address, set_as_default=False) as other:
        assert dask_compat.first_value(client, "zcompat-first-1", 3, 10.0) == 3
        assert dask_compat.first_value(other, "zcompat-first-1", 5, 10.0) == 3
        assert dask_compat.first_value(other, "zcompat-first-2", 5, 10.0) == 5
        assert client.get_metadata("zcompat-first-1") == 3


def _spans(span_id: str, dask_scheduler=None) -> dict:
    ext = dask_scheduler.extensions["spans"]
    ours = [s for s in ext.spans.values() if s.name == OURS]
    return {"ids": sorted(s.id for s in ours), "groups": sorted(tg.name for s in ours for tg in s.groups),
            "collections": [len((s.metadata or {}).get("collections", ())) for s in ours],
            "defaults": len(ext.spans_search_by_name.get(("default",), []))}


def _trim(dask_scheduler=None) -> None:
    dask_compat.forget_finished_spans(dask_scheduler, OURS, keep=0, quiet=0)


def _finished_defaults_stopped(dask_scheduler=None) -> bool:
    """Whether every finished default span without a live task group stopped before now. A span's
    stop is a worker's clock moved by Dask's estimate of its offset from the scheduler's (half a
    heartbeat's round trip at most), so on a loaded machine it can lie a little ahead."""
    live = {id(tg) for tg in dask_scheduler.task_groups.values()}
    now = time.time()
    return all(s.stop < now for s in dask_scheduler.extensions["spans"].spans_search_by_name.get(("default",), [])
               if s.done and not any(id(tg) in live for tg in s.groups))


def test_a_fixed_span_collects_every_submission(client):
    """``dask.annotate(span={"name", "ids"})``: every graph submitted in the block, however many, goes
    to one span with that id."""
    futures = []
    for i in range(3):
        with dask_compat.fixed_span(OURS, "zcompat-span-1"):
            tasks = {f"zcompat-spanned-{i}": dask_compat.task(f"zcompat-spanned-{i}", _fast, i)}
            futures += dask_compat.submit_graph(client, tasks, list(tasks), f"zcompat-spanned-{i}")
    assert [f.result(timeout=30) for f in futures] == [0, 1, 2]
    seen = client.run_on_scheduler(_spans, "zcompat-span-1")
    assert seen["ids"] == ["zcompat-span-1"] and seen["groups"] == ["zcompat-spanned"]
    client.cancel(futures)


def test_finished_spans_are_forgotten(client):
    """The spans extension's records, edited in place: the forgotten task groups leave our span, its
    collections are cut to distinct entries, and finished default spans are dropped."""
    for i in range(2):
        with dask_compat.fixed_span(OURS, "zcompat-span-2"):
            tasks = {f"zcompat-trimmed-{i}": dask_compat.task(f"zcompat-trimmed-{i}", _fast, i)}
            (future,) = dask_compat.submit_graph(client, tasks, list(tasks), f"zcompat-trimmed-{i}")
        future.result(timeout=30)
        client.cancel([future])  # every task done: the next submission opens a new default span
        deadline = time.monotonic() + 30
        while client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks)):
            assert time.monotonic() < deadline, "the scheduler kept the released tasks"
            time.sleep(0.05)
    client.submit(_fast, 0, key="zcompat-default-1", pure=False).result(timeout=30)  # a default span
    before = client.run_on_scheduler(_spans, "zcompat-span-2")
    assert before["groups"] and max(before["collections"]) >= 2 and before["defaults"] >= 1
    deadline = time.monotonic() + 30
    while not client.run_on_scheduler(_finished_defaults_stopped):
        assert time.monotonic() < deadline, "a finished default span kept a stop time ahead of the scheduler's clock"
        time.sleep(0.05)
    client.run_on_scheduler(_trim)
    after = client.run_on_scheduler(_spans, "zcompat-span-2")
    assert after["groups"] == [] and max(after["collections"]) == 1
    assert after["defaults"] <= 1  # the live one (the default task above is released when collected)


def test_the_key_name_cache_can_be_emptied():
    """``dask.utils.key_split`` is an ``lru_cache`` (``cache_clear``)."""
    from dask.utils import key_split

    key_split("zcompat-cache-1")
    assert key_split.cache_info().currsize > 0
    dask_compat.forget_key_names()
    assert key_split.cache_info().currsize == 0


def test_distributed_draws_nothing_from_the_global_random():
    """``distributed.utils_comm.retry`` jitters its delays with the module's ``random``: once the
    adapter is imported, that is a generator of its own, not the global one."""
    import asyncio

    import distributed.utils_comm

    calls = []

    async def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise OSError("not yet")
        return "done"

    random.seed(1234)
    state = random.getstate()
    assert asyncio.run(distributed.utils_comm.retry(flaky, count=3, delay_min=0.001, delay_max=0.002)) == "done"
    assert len(calls) == 3 and random.getstate() == state


def _nanny_from_host(export: bool) -> tuple[int, int, dict, dict]:
    """Start a scheduler and a nanny here, its worker from a host (inside ``processes_from``):
    (the worker's parent, the host's pid, this process's environment before, while it ran)."""
    import asyncio
    import os

    import psutil
    from distributed import Nanny, Scheduler

    from zephon_dask.execution.host import Host

    host = Host(dict(os.environ))
    before = dict(os.environ)

    async def run() -> tuple[int, dict]:
        async with Scheduler(host="127.0.0.1", port=0, dashboard=False) as scheduler:
            nanny = Nanny(scheduler.address, host="127.0.0.1", nthreads=1, dashboard=False)
            if not export:
                dask_compat.no_environ_export(nanny)
            with dask_compat.processes_from(host.context):
                await nanny
            try:
                return psutil.Process(nanny.pid).ppid(), dict(os.environ)
            finally:
                await nanny.close(timeout=20)

    try:
        with dask.config.set({"distributed.nanny.pre-spawn-environ.ZCOMPAT_EXPORTED": "yes"}):
            parent, during = asyncio.run(asyncio.wait_for(run(), 60))
        return parent, host.pid, before, during
    finally:
        host.close(10)
        for key in set(os.environ) - set(before):  # what a nanny exported
            del os.environ[key]


def test_a_nanny_starts_its_worker_from_the_context_named():
    """A nanny's worker started inside ``processes_from(context)`` is that context's (forked by the
    host here); outside it, the nanny's names answer Dask's own context again."""
    import distributed.nanny
    import distributed.process
    import distributed.utils

    parent, host, _, _ = _nanny_from_host(export=False)
    assert parent == host
    assert distributed.process.get_mp_context() is distributed.utils.get_mp_context()
    assert distributed.nanny.get_mp_context() is distributed.utils.get_mp_context()


def test_a_nanny_told_so_exports_nothing():
    """Dask's nanny exports its ``pre-spawn-environ`` into its own process before it starts its
    worker (``pre_spawn_env``); emptied, and inside ``processes_from`` (no proctitle mark either),
    this process's environment stays as it was."""
    _, _, before, during = _nanny_from_host(export=True)
    assert during.get("ZCOMPAT_EXPORTED") == "yes"  # Dask's behaviour: exported here
    _, _, before, during = _nanny_from_host(export=False)
    assert during == before


def test_the_worker_environ_is_the_nannys():
    """``worker_environ(env)`` is the environment a nanny built with ``env`` sets for its worker."""
    import asyncio
    import os

    from distributed import Nanny

    settings = {"distributed.nanny.pre-spawn-environ": {"ZCOMPAT_A": "1", "ZCOMPAT_NONE": None},
                "distributed.nanny.environ": {"ZCOMPAT_B": 2}}

    async def nanny_env() -> dict:
        nanny = Nanny("tcp://127.0.0.1:1", host="127.0.0.1", env={"ZCOMPAT_C": 3}, dashboard=False)
        return nanny.env

    with dask.config.set(settings):
        env = asyncio.run(nanny_env())
        assert dask_compat.worker_environ({"ZCOMPAT_C": 3}) == {**env, dask_compat.PROCTITLE_ENV: str(os.getpid())}
    assert {"ZCOMPAT_A": "1", "ZCOMPAT_B": "2", "ZCOMPAT_C": "3"}.items() <= env.items() and "ZCOMPAT_NONE" not in env


def _fresh_python(code: str, env: dict | None = None) -> str:
    import os

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, **(env or {})})
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip()


def test_a_cluster_left_to_us_is_not_closed_at_exit():
    """Dask's exit handler (``distributed.deploy.spec.close_clusters``) skips a cluster whose
    ``shutdown_on_close`` is false."""
    code = ("from distributed import LocalCluster; from distributed.deploy.spec import close_clusters; "
            "from zephon_dask.execution import dask_compat\n"
            "c = LocalCluster(n_workers=0, processes=False, dashboard_address='127.0.0.1:0')\n"
            "dask_compat.leave_to_us_at_exit(c); close_clusters(); print(c.status.name); c.close(timeout=10)")
    assert _fresh_python(code) == "running"


def test_a_process_inherits_the_serialized_config():
    """``DASK_INTERNAL_INHERIT_CONFIG``: a process started with it reads that config (the embedded
    cluster's scheduler process gets the embedded settings so)."""
    config = dask.config.serialize({"zcompat": {"inherited": 7}})
    code = "import dask, json; print(json.dumps(dask.config.get('zcompat.inherited', None)))"
    assert json.loads(_fresh_python(code, {dask_compat.INHERIT_CONFIG_ENV: config})) == 7


def _bokeh_loaded() -> bool:
    return any(name == "bokeh" or name.startswith("bokeh.") for name in sys.modules)


def test_dashboard_on_first_visit(corpus_dir):
    """The embedded cluster's scheduler serves Dask's dashboard at its link, but imports bokeh and
    builds the dashboard (0.6-0.7 s of its CPU at every start, on the cores the windows need) only
    when the dashboard is first visited; then every page of it is served."""
    import urllib.request

    from tests.helpers.pipelines import build

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # 127.0.0.1, never a proxy
    with build(corpus_dir, n_workers=1) as p:
        next(iter(p))
        runner = p.session.runner()
        assert runner.client is not None  # the cluster up (the head start made the first batch)
        link = runner.dashboard_link
        assert link.startswith("http://127.0.0.1:") and link.endswith("/status")
        assert not runner.client.run_on_scheduler(_bokeh_loaded)
        with opener.open(link.rsplit("/", 1)[0] + "/health", timeout=30) as reply:  # the scheduler's own routes
            assert reply.status == 200
        assert not runner.client.run_on_scheduler(_bokeh_loaded)
        with opener.open(link.rsplit("/", 1)[0] + "/", timeout=60) as reply:  # redirected to /status
            assert reply.status == 200 and reply.url.endswith("/status") and b"bokeh" in reply.read().lower()
        assert runner.client.run_on_scheduler(_bokeh_loaded)
        with opener.open(link.rsplit("/", 1)[0] + "/workers", timeout=60) as reply:
            assert reply.status == 200


def test_a_cluster_retiring_without_its_scheduler_is_quiet_once_called_off():
    """``SpecCluster._correct_state`` (what ``scale`` and ``close`` run) runs the cluster's
    ``_correct_state_internal``: the method ``QuietRetirement`` wraps, so that the comm error of a
    scheduler already gone is not raised once the subclass calls retirement off, and still is
    before."""
    import asyncio

    from distributed import SpecCluster
    from distributed.comm.core import CommClosedError

    class GoneScheduler(SpecCluster):
        async def _correct_state_internal(self) -> None:  # retiring through a comm already closed
            self._correct_state_waiting = None
            raise CommClosedError("in <TCP (closed) rpc.retire_workers>: Stream is closed")

    class Cluster(dask_compat.QuietRetirement, GoneScheduler):
        called_off = False

        def retirement_called_off(self) -> bool:
            return self.called_off

    async def retire(called_off: bool) -> None:
        cluster = Cluster.__new__(Cluster)  # no cluster started: only the method's path is checked
        cluster._correct_state_waiting, cluster.called_off = None, called_off
        await asyncio.wait_for(SpecCluster._correct_state(cluster), 10)

    asyncio.run(retire(True))
    with pytest.raises(CommClosedError):
        asyncio.run(retire(False))
