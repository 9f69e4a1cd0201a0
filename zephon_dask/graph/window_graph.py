"""The Dask graph of one window, the one place that says which tasks make a window. Pure:
a description, built without a cluster.

Unfused: one task per chunk (read + stateless operators) feeding one window
task (accumulators). Fused: a single task computing the whole window, fewer
scheduler round trips for small windows. Both give the same bytes.

:meth:`WindowGraph.tasks_for` builds the tasks (Dask task-spec nodes). The
in-process runners execute :meth:`WindowGraph.to_dict` (those tasks plus the
spec as data), the ``distributed`` runner submits the tasks themselves with the
spec as a future it holds (or by value), and the inspector lists and draws
:meth:`WindowGraph.to_dict`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from dask.task_spec import DataNode, List, Task, TaskRef

from ..core.spec import PipelineSpec
from ..core.window import compute_chunk, compute_window, finish_window
from ..errors import NotFoundError
from .keys import again_key, chunk_key, spec_key, window_key


@dataclass(frozen=True)
class WindowGraph:
    lane: int
    window: int
    chunks: tuple[int, ...]
    chunk_keys: tuple[str, ...]
    key: str
    spec_key: str
    fused: bool

    @property
    def label(self) -> str:
        """The window, for messages: ``lane 3, window 5``."""
        return f"lane {self.lane}, window {self.window}"

    @property
    def task_keys(self) -> tuple[str, ...]:
        """The keys of :meth:`tasks_for`, in dependency order: the chunks, then the window."""
        return (*self.chunk_keys, self.key)

    @property
    def producer_keys(self) -> tuple[str, ...]:
        """The keys of the tasks that read data (a fused window, a chunk): the distributed runner
        submits them as data producers, which Dask's scheduler always queues and hands to workers
        in priority order. Otherwise it queues only the tasks of a group much larger than the
        cluster, so at the start of an iteration a few fused windows went straight to the workers
        while the split first windows' chunks, a larger group, waited in the queue behind them
        (the first batch waited for several windows instead of a fraction of one)."""
        return (self.key,) if self.fused else self.chunk_keys

    def tasks_for(self, spec: Any) -> dict[str, Task]:
        """The window's tasks by key, in dependency order. ``spec`` is every task's spec
        argument: a reference to the spec's task (a ``TaskRef`` or a ``distributed`` future,
        which is one) or the :class:`PipelineSpec` itself."""
        if self.fused:
            return {self.key: Task(self.key, compute_window, spec, self.lane, self.window)}
        tasks = {k: Task(k, compute_chunk, spec, g) for k, g in zip(self.chunk_keys, self.chunks, strict=True)}
        chunks = List(*map(TaskRef, self.chunk_keys))
        tasks[self.key] = Task(self.key, finish_window, spec, self.lane, self.window, chunks)
        return tasks

    def to_dict(self, spec: PipelineSpec) -> dict:
        """The whole graph (``dask.get``-able): ``spec`` as data under :attr:`spec_key`, then
        :meth:`tasks_for` referring to it."""
        return {self.spec_key: DataNode(self.spec_key, spec), **self.tasks_for(TaskRef(self.spec_key))}

    def kind(self, key: str) -> str:
        """What the task under ``key`` computes: ``spec``, ``chunk``, ``window`` or ``fused-window``."""
        if key == self.key:
            return "fused-window" if self.fused else "window"
        if key == self.spec_key:
            return "spec"
        if key in self.chunk_keys:
            return "chunk"
        raise NotFoundError(f"{key!r} is not a task of lane {self.lane}, window {self.window}'s graph")

    def fused_copy(self, n: int) -> WindowGraph:
        """The same window as one fused task under a key of its own (its ``n``-th copy), for
        computing it again beside the original."""
        return replace(self, chunk_keys=(), key=again_key(self.key, n), fused=True)


def window_graph(spec: PipelineSpec, lane: int, window: int, fused: bool = False) -> WindowGraph:
    fp = spec.fingerprint
    chunks = tuple(spec.window_chunks(lane, window))
    keys = () if fused else tuple(chunk_key(fp, lane, window, i) for i in range(len(chunks)))
    return WindowGraph(lane, window, chunks, keys, window_key(fp, lane, window, fused), spec_key(fp), fused)
