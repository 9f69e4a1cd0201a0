"""The contract every runner implements: :class:`Runner` and :class:`WindowHandle`.

A runner executes :class:`~zephon_dask.graph.WindowGraph` objects for one
pipeline spec; ``submit`` returns a :class:`WindowHandle` whose ``result()``
gives the window's output. ``submit_group`` takes several windows at once and
returns a handle per window: by default each is submitted on its own; a runner
that computes them as one task (:class:`GroupResult`) hands out
:class:`MemberHandle` objects. A runner holds whatever it started (a thread
pool, a cluster client) until ``close()``; a handle holds its pending result
until ``release()``. This module holds no state of its own.
"""

from __future__ import annotations

import math
from typing import ClassVar

import dask

from ..core.spec import PipelineSpec
from ..core.window import WindowOutput
from ..errors import ClosedError
from ..graph import GroupGraph, WindowGraph

# The automatic windows_per_task (auto_windows_per_task):
CONTROL_SHARE = 0.25  # a window's share of its task's cost besides the work: at most this of its own work
MAX_WINDOWS_PER_TASK = 8  # windows per task at most (stall_timeout counts a whole task)
AUTO_AFTER = 4  # windows taken, one per task, before it decides (at least; the first batches never wait on a group)
AUTO_HELD_BYTES = 128 << 20  # a prefetch the automatic size scales holds at most this (or what it held unscaled)


def auto_windows_per_task(window_cpu: float, task_cpu: float, most: int = MAX_WINDOWS_PER_TASK) -> int:
    """The automatic ``windows_per_task``, for windows of ``window_cpu`` CPU seconds each on a
    runner whose tasks cost ``task_cpu`` besides their work (:attr:`Runner.task_cpu`): the fewest
    windows per task that bring that cost, shared by a task's windows, down to
    :data:`CONTROL_SHARE` of a window's work, at most ``most`` (:func:`most_windows_per_task`);
    1 where a task costs nothing. Large windows (from ``task_cpu / CONTROL_SHARE`` of CPU) keep
    one per task: grouping them would hold each one's result back for the others' work and
    save a small share."""
    if task_cpu <= 0:
        return 1
    most = max(1, most)
    share = CONTROL_SHARE * window_cpu  # what a window may cost besides its work
    if share * most < task_cpu:
        return most
    return max(1, math.ceil(task_cpu / share - 1e-9))


def held_windows_per_task(prefetch: int, window_bytes: float, budget: int = AUTO_HELD_BYTES) -> int:
    """The automatic ``windows_per_task``'s ceiling where it scales the prefetch (``prefetch``
    windows unscaled, of ``window_bytes`` each as held): as many as keep the scaled prefetch's
    bytes within ``budget``, at least 1. Cheap windows are not always small (stored tokens): a
    scaled prefetch would otherwise hold up to :data:`MAX_WINDOWS_PER_TASK` times the bytes."""
    return max(1, int(budget // max(1.0, prefetch * window_bytes)))


def most_windows_per_task(prefetch: int | None = None, threads: int = 1) -> int:
    """The automatic ``windows_per_task``'s ceiling: :data:`MAX_WINDOWS_PER_TASK`, and with a
    ``prefetch`` given (``prefetch_windows`` set; else the consumer scales its prefetch with the
    size, see :meth:`Runner.default_prefetch`) as many as leave two tasks in flight per worker
    thread of the consumer's ``threads`` (``prefetch // (2 * threads)``), at least 1."""
    if prefetch is None:
        return MAX_WINDOWS_PER_TASK
    return max(1, min(MAX_WINDOWS_PER_TASK, prefetch // (2 * max(1, threads))))


class WindowHandle:
    """A submitted window: ``result()`` blocks for it, ``release()`` frees it."""

    def __init__(self, graph: WindowGraph | GroupGraph, future=None, compute=None):
        self.graph, self._future, self._compute = graph, future, compute

    def done(self) -> bool:
        return self._future is None or self._future.done()

    @property
    def held(self):
        """The result held in this process before it is taken (a task of several windows: all of
        them, a tuple), else ``None`` (here: a runner that computes or fetches ahead says)."""
        return None

    @property
    def held_nbytes(self) -> int:
        """Bytes of :attr:`held`."""
        value = self.held
        return 0 if value is None else sum(v.__sizeof__() for v in value) if isinstance(value, tuple) \
            else value.__sizeof__()

    def chunks_done(self) -> int:
        """How many of the window's chunks are computed (all once :meth:`done`); a runner that
        sees its chunk tasks finish tells them apart, the others say 0 until done."""
        return len(getattr(self.graph, "chunks", ())) if self.done() else 0

    def result(self) -> WindowOutput:
        try:
            if self._future is None:
                return self._compute()
            return self._future.result()
        except Exception as exc:
            exc.add_note(f"zephon_dask: while computing {self.graph.label}")
            raise

    def release(self) -> None:
        self._future = self._compute = None


class GroupResult:
    """The handle of one task computing several windows, shared by its members' handles.

    The task's result (its windows, in member order) is fetched once, by the first member asked
    for; the task's handle is released then (the windows are here now), or once every member has
    been released unfetched. Each member's window is dropped from here as the member takes it."""

    def __init__(self, handle: WindowHandle, size: int):
        """``handle``: the task's, whose result is its windows in member order; ``size`` members."""
        self._handle: WindowHandle | None = handle
        self._values: list[WindowOutput | None] | None = None
        self._open = set(range(size))  # members neither taken nor released

    def done(self) -> bool:
        return self._values is not None or self._handle is None or self._handle.done()

    @property
    def handle(self) -> WindowHandle | None:
        """The task's handle until its result is fetched here or every member let it go."""
        return self._handle

    def held_nbytes(self, i: int) -> int:
        """Bytes of member ``i``'s window held in this process and not yet taken."""
        values = self._values
        if values is None:
            handle = self._handle
            values = handle.held if handle is not None else None
        value = values[i] if isinstance(values, tuple | list) and i < len(values) else None
        return value.__sizeof__() if value is not None else 0

    def take(self, i: int) -> WindowOutput:
        """Member ``i``'s window (blocking on the first call)."""
        if self._values is None:
            if self._handle is None:
                raise ClosedError("this window's task was released before its result was fetched")
            self._values = list(self._handle.result())  # type: ignore[call-overload]
            self._handle.release()
            self._handle = None
        value = self._values[i]
        self._values[i] = None
        if value is None:
            raise ClosedError(f"member {i} of this task already took its window")
        self.drop(i)
        return value

    def drop(self, i: int) -> None:
        """Member ``i`` no longer needs its window; the last member out releases the task."""
        self._open.discard(i)
        if not self._open:
            handle, self._handle, self._values = self._handle, None, None
            if handle is not None:
                handle.release()


class MemberHandle(WindowHandle):
    """One window of a :class:`GroupResult`: ``result()`` takes it, ``release()`` lets it go."""

    def __init__(self, graph: WindowGraph, group: GroupResult, index: int):
        super().__init__(graph)
        self._group: GroupResult | None = group
        self._index = index

    def done(self) -> bool:
        return self._group is None or self._group.done()

    @property
    def task(self) -> WindowHandle | None:
        """The handle of the task computing this window with the others (``None`` once its result
        is here or every member let it go)."""
        group = self._group
        return group.handle if group is not None else None

    @property
    def held_nbytes(self) -> int:
        """Bytes of this member's window held here, not yet taken: from the task's result once a
        member took it, else from what the task's handle fetched ahead (:attr:`WindowHandle.held`)."""
        group = self._group
        return group.held_nbytes(self._index) if group is not None else 0

    def result(self) -> WindowOutput:
        if self._group is None:
            raise ClosedError(f"{self.graph.label} was released before its result was taken")
        return self._group.take(self._index)

    def release(self) -> None:
        group, self._group = self._group, None
        if group is not None:
            group.drop(self._index)


class Runner:
    """Base runner: runs window graphs; ``close()`` frees every resource it started.

    A subclass sets ``name`` (its key in :data:`~zephon_dask.execution.registry.RUNNERS`),
    implements :meth:`submit`, and overrides :meth:`from_options` when it reads options. What
    it can do are class attributes, read by the layers above instead of its name:

    * ``computes_in_caller``: a window is computed in the consumer's thread when its result
      is asked for, so nothing runs meanwhile (no progress to show while waiting);
    * ``has_dashboard``: once started, it may serve a Dask dashboard (:attr:`dashboard_link`);
    * ``task_cpu``: the CPU seconds one task costs besides its windows' work, over every
      process (scheduling, messages, fetching its result), which the automatic
      ``windows_per_task`` (:func:`auto_windows_per_task`) weighs against a window's work; 0
      where a window costs nothing more than its work (an in-process runner).
    """

    name = "base"
    computes_in_caller: ClassVar[bool] = False
    has_dashboard: ClassVar[bool] = False
    task_cpu: ClassVar[float] = 0.0  # CPU seconds a task costs besides its work (0: nothing worth grouping)

    def __init__(self, spec: PipelineSpec):
        self.spec = spec

    @property
    def dashboard_link(self) -> str | None:
        """The Dask dashboard's address, or ``None`` for a runner without one."""
        return None

    @property
    def starting(self) -> bool:
        """Whether the runner is still starting (an embedded cluster); inspection then says so
        instead of waiting."""
        return False

    @classmethod
    def from_options(cls, spec: PipelineSpec, options: dict) -> Runner:
        """The runner for ``spec``, started from the pipeline's execution ``options`` (a
        missing option takes the runner's default)."""
        return cls(spec)

    def submit(self, graph: WindowGraph, priority: int) -> WindowHandle:  # pragma: no cover
        raise NotImplementedError

    def submit_group(self, graphs: list[WindowGraph], priority: int, stall_windows: int | None = None) -> list[WindowHandle]:
        """A handle per window of ``graphs`` (fused windows, in the order they are needed, the
        first at ``priority``): here, each submitted on its own, one priority lower than the one
        before. A runner that computes them as one task overrides this (``stall_windows``: how
        many windows' ``stall_timeout`` that task may compute, by default one per window)."""
        return [self.submit(g, priority - i) for i, g in enumerate(graphs)]

    @property
    def shared(self) -> bool:
        """Whether other processes' pipelines may compute on the same workers."""
        return False

    @property
    def slots(self) -> int:
        """How many windows this runner computes at once."""
        return 1

    def agree(self, name: str, value: int) -> int:
        """``value``, or on a :attr:`shared` runner the value the first consumer of the cluster
        to ask under ``name`` for this spec gave (an execution choice the ranks sharing the
        cluster must make alike, so that peers keep submitting the same task keys)."""
        return value

    def default_prefetch(self, lanes: int | None = None) -> int:
        """Windows to keep in flight when ``prefetch_windows`` is not set: two per slot plus
        four, so that while the consumer waits for the window it needs next, every other
        slot still has a window to compute (results are taken in order, computed out of it).

        On a :attr:`shared` runner, a consumer of ``lanes`` of the ``canonical_replicas``
        lanes counts only its share of the slots: the ranks sharing one cluster then keep
        about two windows per worker thread in flight between them, instead of each
        sizing its prefetch on the whole cluster (512 ranks on 4,096 threads would
        otherwise hold 512 x 8,196 windows). With the automatic ``windows_per_task`` the
        consumer multiplies it by the windows per task (the same tasks in flight:
        :class:`~zephon_dask.consumer.fetcher.WindowFetcher`)."""
        return 2 * self.share(lanes) + 4

    def share(self, lanes: int | None = None) -> int:
        """The :attr:`slots` a consumer of ``lanes`` of the ``canonical_replicas`` lanes counts
        as its own: all of them, or on a :attr:`shared` runner its share (at least 1)."""
        slots = self.slots
        if self.shared and lanes is not None:
            slots = max(1, math.ceil(slots * lanes / self.spec.canonical_replicas))
        return slots

    def first_batch_taken(self) -> None:
        """The consumer has cut its first batch: work held back so as not to compete with it
        (an embedded cluster's start) may begin. Nothing here."""

    def _run_local(self, graph: WindowGraph) -> WindowOutput:
        return dask.get(graph.to_dict(self.spec), graph.key)

    def close(self) -> None:
        pass

    def describe(self) -> str:
        return self.name
