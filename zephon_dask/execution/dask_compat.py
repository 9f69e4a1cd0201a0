"""Every use of Dask's private APIs and undocumented behaviours, in one module. Module state: the
context :func:`processes_from` names (a ``ContextVar``); :func:`isolate_jitter` gives two of
``distributed``'s modules a generator of their own, :func:`processes_from` two of them a
``get_mp_context`` of ours.

Importing this module does not import ``distributed`` (~0.4 s of CPU: the first batch of the
embedded cluster's head start does not wait for it); each function using it imports it.

The rest of the package uses Dask's public API only: ``tests/docs/test_architecture.py`` refuses a
private Dask name, a private keyword or an internal ``distributed`` module anywhere else. Each item
below says why it is needed and what breaks if Dask changes it; ``tests/cluster/test_dask_compat.py`` has
one test per item, named after it, so a Dask release that changes one fails that test instead of a
training run. ``pyproject.toml`` bounds dask and distributed below the first minor release not
tested.
"""

from __future__ import annotations

import os
import random
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar

import dask
from dask._expr import LLGExpr
from dask.task_spec import Task
from dask.utils import key_split

# -- tasks and submission ------------------------------------------------------------------------


def task(key: str, func, *args, producer: bool = False, **kwargs) -> Task:
    """A task; ``producer`` marks it a data producer (``Task(_data_producer=True)``).

    Why: the scheduler queues a data producer and hands it out in priority order however few there
    are (``Scheduler.is_rootish``); otherwise it queues only groups much larger than the cluster, and
    at an iteration's start a few fused windows went to the workers before the first window's chunks
    (the first batch waited for several windows). ``Client.submit`` has no way to set it.
    If Dask drops the keyword: ``TypeError`` at the first submission. If the scheduler stops reading
    it: no error, the first batch comes later (``test_producer_task_is_queued_by_the_scheduler``)."""
    return Task(key, func, *args, _data_producer=producer, **kwargs)


def submit_graph(client, tasks: dict[str, Task], keys: Sequence[str], name: str, **kwargs) -> list:
    """Submit ``tasks`` as one graph (``Client.get(..., sync=False)``), named ``name``; the futures
    of ``keys``. ``kwargs`` go to ``Client.get``.

    Why: ``Client.get(dict)`` wraps the graph in ``LLGExpr(dict)``, which tokenizes every task (the
    spec's future, the functions) on the submitting thread to name it; naming it by its unique
    window key (``_determ_token``, as ``Client.submit`` names its own one-task graphs) skips that:
    219-232 us of the submitting thread per fused window, against 295-492 us through ``Client.get``
    (``Client.submit``, 198-220 us, cannot mark a data producer, see :func:`task`). The name is the
    submission's only; the task keys are the graph's. If Dask drops ``LLGExpr`` or the keyword:
    ``ImportError``/``TypeError`` (``test_a_graph_submitted_under_a_name_is_not_tokenized``)."""
    return client.get(LLGExpr(tasks, _determ_token=name), list(keys), sync=False, **kwargs)


def wait_first(client, futures: Sequence, timeout: float, deadline: float) -> None:
    """Return once one of ``futures`` is done, or raise ``TimeoutError`` after ``timeout`` seconds;
    the call itself ends within ``deadline`` seconds (``callback_timeout``) even if the client's
    event loop stops answering.

    Why: ``distributed.wait``, the public form, waits through the default client only (this
    library's clients are never the default: ``set_as_default=False``), and without a deadline of
    its own. It is ``client.sync(_wait, ...)``, as here. If ``_wait`` moves: ``ImportError``
    (``test_wait_first_returns_at_the_first_done_future``)."""
    from distributed.client import FIRST_COMPLETED, _wait

    client.sync(_wait, list(futures), timeout=timeout, return_when=FIRST_COMPLETED, callback_timeout=deadline)


async def until_done(futures: Sequence) -> None:
    """On the client's event loop: return once every one of ``futures`` is done (a result lost with
    its worker is waited for again). Why and what breaks: as :func:`wait_first` (no public
    coroutine waits for a future without fetching its result)."""
    from distributed.client import _wait

    await _wait(list(futures))


# -- scheduler queries, each with a deadline -----------------------------------------------------
# Why: the public forms (Client.scheduler_info, Client.processing, Client.who_has) make the same
# RPCs but take no deadline: a frozen scheduler would hang the training loop that asks. These make
# the RPC through the client's own event loop (client.sync) with callback_timeout. If a handler is
# renamed or its answer changes shape: test_scheduler_queries_answer_in_the_shape_read.


def identity(client, n_workers: int, timeout: float) -> dict:
    """The scheduler's identity (``n_workers`` workers listed: -1 all, 0 none): ``n_workers``,
    ``total_threads``, ``workers`` (each with ``last_seen``), ..."""
    return client.sync(client.scheduler.identity, n_workers=n_workers, callback_timeout=timeout)


def processing(client, timeout: float) -> dict[str, list]:
    """``{worker: keys it computes or has queued}``."""
    return client.sync(client.scheduler.processing, callback_timeout=timeout)


def who_has(client, keys: Sequence[str], timeout: float) -> dict[str, list[str]]:
    """``{key: workers holding its result}``."""
    return client.sync(client.scheduler.who_has, keys=list(keys), callback_timeout=timeout)


# -- spans: the scheduler's per-computation records ----------------------------------------------


@contextmanager
def fixed_span(name: tuple[str, ...], span_id: str) -> Iterator[None]:
    """Submissions in this block go to one span, ``name`` with id ``span_id``, however many there are.

    Why: ``distributed.span(name)`` (public) gives each ``with`` block a new id, and a span's records
    (the scheduler's and every worker's per-span metrics) are never dropped; one fixed id per runner
    keeps them one entry per task group. Relies on the annotation's format (``{"name", "ids"}``). If
    it changes: spans grow again, no error (``test_a_fixed_span_collects_every_submission``)."""
    with dask.annotate(span={"name": name, "ids": (span_id,)}):
        yield


def forget_finished_spans(scheduler, ours: tuple[str, ...], keep: int, quiet: float) -> None:
    """In the scheduler (a scheduler plugin calls it on the scheduler's event loop): drop all but
    the last ``keep`` default spans that finished over ``quiet`` seconds ago and hold no live task
    group; drop from the spans named ``ours`` the task groups the scheduler has forgotten; cut each
    span's list of submitted collections to its distinct entries.

    Why: Dask starts a new default span each time every task was done and never drops one; a span
    lists every task group it ever had (a window's task group is new each time the previous one's
    tasks were all released) and one collection entry per graph submitted (one per window): a long
    run's scheduler grew without end. No public API trims them: this edits the spans extension's
    records (``spans``, ``spans_search_by_name``, ``spans_search_by_tag``, ``root_spans``, a span's
    ``groups``, ``done``, ``stop``, ``children``, ``metadata``). If they are renamed: the scheduler
    plugin fails (``test_finished_spans_are_forgotten``); if Dask trims them itself, this is moot."""
    ext = scheduler.extensions.get("spans")
    if ext is None:
        return
    defaults = ext.spans_search_by_name.get(("default",), [])
    live = {id(tg) for tg in scheduler.task_groups.values()}
    now = time.time()  # Dask's span times are wall-clock times
    gone = {s.id for s in defaults[:max(0, len(defaults) - keep)]
            if s.done and not s.children and not any(id(tg) in live for tg in s.groups)
            and now - s.stop >= quiet}
    for span in ext.spans.values():
        if span.name == ours:
            span.groups.difference_update([tg for tg in span.groups if id(tg) not in live])
        collections = (span.metadata or {}).get("collections")
        if collections:
            distinct: list = []
            for c in collections:
                if c not in distinct:
                    distinct.append(c)
            collections[:] = distinct
    for span_id in gone:
        ext.spans.pop(span_id, None)
    if gone:
        for spans in (defaults, ext.spans_search_by_tag.get("default", []), ext.root_spans):
            spans[:] = [s for s in spans if s.id not in gone]


def forget_key_names() -> None:
    """Empty Dask's cache of task-name prefixes (``key_split``, an ``lru_cache`` of 100,000 keys).

    Why: every key ever seen stays there, and each window's keys are new, so it grows for hours
    (~0.17 KB a key) in the scheduler and every worker. If ``key_split`` stops being an
    ``lru_cache``: ``AttributeError`` in the trim plugins
    (``test_the_key_name_cache_can_be_emptied``)."""
    key_split.cache_clear()


# -- the training process ------------------------------------------------------------------------


def isolate_jitter() -> None:
    """Give ``distributed.utils_comm`` and ``distributed.comm.core`` a ``random.Random`` of their own.

    Why: the client's process is the training process; distributed picks the worker to fetch a
    result from and jitters its retries with Python's global ``random`` in those modules, which
    would move a framework's restored RNG state. If the draws move to another module: no error,
    the global RNG moves again (``test_distributed_draws_nothing_from_the_global_random``)."""
    import distributed.comm.core
    import distributed.utils_comm

    for module in (distributed.utils_comm, distributed.comm.core):
        if not isinstance(vars(module).get("random"), random.Random):
            vars(module)["random"] = random.Random()


if "distributed" in sys.modules:  # otherwise the runner calls it when it imports distributed
    isolate_jitter()


# -- the embedded cluster's processes -------------------------------------------------------------

_PROCESSES_FROM: ContextVar = ContextVar("zephon_dask_processes_from", default=None)


def _get_mp_context():
    """``distributed.utils.get_mp_context``, unless :func:`processes_from` names another context."""
    import distributed.utils

    return _PROCESSES_FROM.get() or distributed.utils.get_mp_context()


def _enable_proctitle_on_children() -> None:
    """``distributed.proctitle.enable_proctitle_on_children``, outside :func:`processes_from`."""
    import distributed.proctitle

    if _PROCESSES_FROM.get() is None:
        distributed.proctitle.enable_proctitle_on_children()


# the variable by which Dask's processes know they are a nanny's child (their title is then set)
PROCTITLE_ENV = "__DASK_PARENT_PID"


@contextmanager
def processes_from(context) -> Iterator[None]:
    """The worker processes a nanny starts in this block (its coroutines included, and what they
    start) come from the ``multiprocessing`` context ``context`` (the embedded cluster's host).

    Why: a nanny takes its context from ``distributed.worker.multiprocessing-method``, a global
    setting naming one of Python's own (``spawn``, ``fork``, ``forkserver``); our host is a fork
    server of our own, for our nannies only. The nanny (``WorkerProcess.start``) and
    ``AsyncProcess`` call ``get_mp_context`` by the name they imported; those two names are
    replaced, once, by one that answers ``context`` inside this block and Dask's context elsewhere
    (other clusters in this process are unaffected). The nanny also marks this process's
    environment (``enable_proctitle_on_children``: :data:`PROCTITLE_ENV`, this process's pid) so
    that its worker sets its title; inside this block it does not (:func:`worker_environ` gives the
    host that variable). If Dask renames or moves these: ``AttributeError`` here; if it stops calling
    them: workers are spawned as Dask's own, or this process's environment changes, no error
    (``test_a_nanny_starts_its_worker_from_the_context_named``)."""
    import distributed.nanny
    import distributed.process

    for module in (distributed.nanny, distributed.process):
        vars(module)["get_mp_context"] = _get_mp_context
    vars(distributed.nanny)["enable_proctitle_on_children"] = _enable_proctitle_on_children
    token = _PROCESSES_FROM.set(context)
    try:
        yield
    finally:
        _PROCESSES_FROM.reset(token)


def worker_environ(env: dict[str, str]) -> dict[str, str]:
    """The environment variables Dask's nanny sets for its worker with ``env``: its
    ``pre-spawn-environ`` (the variables exported before the process starts, ``PYTHONHASHSEED``
    fixed), then ``distributed.nanny.environ``, then ``env``; a variable exported here wins over
    the config, as in the nanny; and :data:`PROCTITLE_ENV` (see :func:`processes_from`).

    Why: a worker forked from the embedded cluster's host inherits the host's environment, and
    what acts only at a process's start (glibc's ``MALLOC_*``, ``PYTHONHASHSEED``) must be there
    when the host starts; the nanny computes these in its constructor
    (``distributed.nanny._get_env_variables`` and its ``PYTHONHASHSEED`` default). If that changes:
    ``ImportError``, or the host's environment differs from a nanny's
    (``test_the_worker_environ_is_the_nannys``)."""
    from distributed.nanny import _get_env_variables

    pre_spawn = _get_env_variables("distributed.nanny.pre-spawn-environ")
    if pre_spawn.get("PYTHONHASHSEED") in (None, "0"):
        pre_spawn["PYTHONHASHSEED"] = "6640"
    return {**pre_spawn, **_get_env_variables("distributed.nanny.environ"), **{k: str(v) for k, v in env.items()},
            PROCTITLE_ENV: str(os.getpid())}


def no_environ_export(nanny) -> None:
    """Keep ``nanny`` from exporting its ``pre-spawn-environ`` into this process.

    Why: Dask's nanny exports it (``OMP_NUM_THREADS=1``, ``PYTHONHASHSEED``, ...) into the process
    it runs in, before each start of its worker, so that a spawned worker inherits it; every process
    the training script started afterwards would inherit it too. Our workers are forked from a
    host that has these from its start (:func:`worker_environ`); the nanny still sets its ``env``
    in the worker. Relies on the attribute ``pre_spawn_env``. If it is renamed: this process's
    environment changes again, no error (``test_a_nanny_told_so_exports_nothing``)."""
    nanny.pre_spawn_env = {}


def leave_to_us_at_exit(cluster) -> None:
    """Keep Dask's exit handler from closing ``cluster`` (``shutdown_on_close = False``).

    Why: after a close that timed out, Dask's own exit handler would wait for the cluster again; the
    runner kills its processes itself. If the attribute is renamed: exit waits up to Dask's
    timeout, no error (``test_a_cluster_left_to_us_is_not_closed_at_exit``)."""
    cluster.shutdown_on_close = False


class QuietRetirement:
    """A mixin for a ``SpecCluster`` subclass: once :meth:`retirement_called_off` says so, a failure
    to retire workers through a scheduler already gone is not raised (the subclass decides when).

    Why: ``SpecCluster._correct_state_internal`` (private) retires the workers it closes through
    the scheduler's comm; a close, or a start that failed, runs it from ``scale(0)`` as a callback
    of the event loop, whose error tornado logs with a traceback ("Exception in callback"). The
    embedded cluster's scheduler may be gone first when its host was stopped (the training
    process exiting while the cluster still starts): nothing went wrong. If the method is renamed:
    the traceback is printed again at such an exit, no other effect
    (``test_a_cluster_retiring_without_its_scheduler_is_quiet_once_called_off``)."""

    def retirement_called_off(self) -> bool:
        return False

    async def _correct_state_internal(self) -> None:
        try:
            await super()._correct_state_internal()  # type: ignore[misc]  # (the SpecCluster's, after this mixin)
        except OSError:  # distributed's CommClosedError included
            if not self.retirement_called_off():
                raise


# Read by dask.config when a process starts: the serialized config the embedded cluster's host
# (and so its scheduler) inherits (dask.config.serialize). If it is renamed, the scheduler process starts with
# Dask's defaults, not the embedded ones (test_a_process_inherits_the_serialized_config).
INHERIT_CONFIG_ENV = "DASK_INTERNAL_INHERIT_CONFIG"


def dashboard_on_first_visit(scheduler, prefix: str = "/") -> None:
    """Make Dask's dashboard on ``scheduler`` (started with ``dashboard=False`` and a
    ``dashboard_address``) on the first request for a path its own routes do not serve (its link,
    ``/status``, ...), then send that request to itself, which the dashboard now serves.

    Why: made at the scheduler's start, the dashboard cost every run 0.6-0.7 s of the scheduler's
    CPU (importing bokeh, building its applications), on the cores the head start and the workers
    compute with, whether or not anyone looks at it. Relies on the scheduler's
    ``http_application`` being ``distributed.http.routing.RoutingApplication``, which asks the
    applications in its ``applications`` list, in order, for a path its own routes do not serve,
    and on ``distributed.dashboard.scheduler.connect(application, http_server, scheduler, prefix)``
    adding the dashboard there, as ``Scheduler.__init__`` calls it. If either changes, the
    dashboard's pages answer 404 (``test_dashboard_on_first_visit``)."""
    from tornado import web

    application = scheduler.http_application

    class FirstVisit(web.RequestHandler):
        def get(self, _path: str) -> None:
            if first in application.applications:
                application.applications.remove(first)  # from now on the dashboard answers
                try:
                    import distributed.dashboard.scheduler as dashboard
                except ImportError as exc:  # a bokeh Dask does not take (Dask warned on import)
                    self.set_status(503)
                    self.finish(f"Dask's dashboard is not available: {exc}")
                    return
                dashboard.connect(application, scheduler.http_server, scheduler, prefix=prefix)
            self.redirect(self.request.uri)

    first = web.Application([(r"/(.*)", FirstVisit)])
    application.add_application(first)  # asked only for a path no route of the scheduler's serves


def _setdefault_metadata(key: str, value, dask_scheduler=None):
    """On the scheduler, in one call on its event loop (so atomic): the value of its task
    metadata under ``key``, ``value`` stored there first if it holds none."""
    return dask_scheduler.task_metadata.setdefault(key, value)


def first_value(client, key: str, value, timeout: float):
    """The value the scheduler keeps under ``key``, ``value`` stored first if it keeps none: the
    first of the clients asking decides for all. Why: the scheduler's ``get_metadata`` and
    ``set_metadata`` are two calls, so two clients asking at once could both store; this runs
    Python's ``setdefault`` on the scheduler (``Client.run_on_scheduler``, with a deadline). If the
    scheduler's ``task_metadata`` moves: ``test_first_value_is_the_first_clients``."""
    return client.run_on_scheduler(_setdefault_metadata, key, value, callback_timeout=timeout)


def held_by_a_client(keys) -> bool:
    """Whether a client of this process still holds a future of any of ``keys``.

    Why: a client that could not gather keys reports it at WARNING (and "reschedules" them) even
    when every one was released meanwhile, so that no one waits for them. Relies on
    ``Client._instances`` and ``Client.futures``; if either moves, every key counts as held (the
    report is kept), no error (``test_pipelines_closed_while_a_window_is_fetched_close_quietly``)."""
    from distributed import Client

    clients = getattr(Client, "_instances", None)
    if clients is None:
        return True
    try:
        return any(key in client.futures for client in list(clients) for key in keys)
    except (AttributeError, TypeError):
        return True
