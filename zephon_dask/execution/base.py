"""The contract every runner implements: :class:`Runner` and :class:`WindowHandle`.

A runner executes :class:`~zephon_dask.graph.WindowGraph` objects for one
pipeline spec; ``submit`` returns a :class:`WindowHandle` whose ``result()``
gives the window's output. A runner holds whatever it started (a thread pool,
a cluster client) until ``close()``; a handle holds its pending result until
``release()``. This module holds no state of its own.
"""

from __future__ import annotations

import math

import dask

from ..core.spec import PipelineSpec
from ..core.window import WindowOutput
from ..graph import WindowGraph


class WindowHandle:
    """A submitted window: ``result()`` blocks for it, ``release()`` frees it."""

    def __init__(self, graph: WindowGraph, future=None, compute=None):
        self.graph, self._future, self._compute = graph, future, compute

    def done(self) -> bool:
        return self._future is None or self._future.done()

    def result(self) -> WindowOutput:
        try:
            if self._future is None:
                return self._compute()
            return self._future.result()
        except Exception as exc:
            exc.add_note(f"zephon_dask: while computing lane {self.graph.lane}, window {self.graph.window}")
            raise

    def release(self) -> None:
        self._future = self._compute = None


class Runner:
    """Base runner: runs window graphs; ``close()`` frees every resource it started.

    A subclass sets ``name`` (its key in :data:`~zephon_dask.execution.registry.RUNNERS`),
    implements :meth:`submit`, and overrides :meth:`from_options` when it reads options.
    """

    name = "base"

    def __init__(self, spec: PipelineSpec):
        self.spec = spec

    @property
    def dashboard_link(self) -> str | None:
        """The Dask dashboard's address, or ``None`` for a runner without one."""
        return None

    @classmethod
    def from_options(cls, spec: PipelineSpec, options: dict) -> Runner:
        """The runner for ``spec``, started from the pipeline's execution ``options`` (a
        missing option takes the runner's default)."""
        return cls(spec)

    def submit(self, graph: WindowGraph, priority: int) -> WindowHandle:  # pragma: no cover
        raise NotImplementedError

    @property
    def shared(self) -> bool:
        """Whether other processes' pipelines may compute on the same workers."""
        return False

    @property
    def slots(self) -> int:
        """How many windows this runner computes at once."""
        return 1

    def default_prefetch(self, lanes: int | None = None) -> int:
        """Windows to keep in flight when ``prefetch_windows`` is not set: two per slot plus
        four, so that while the consumer waits for the window it needs next, every other
        slot still has a window to compute (results are taken in order, computed out of it).

        On a :attr:`shared` runner, a consumer of ``lanes`` of the ``canonical_replicas``
        lanes counts only its share of the slots: the ranks sharing one cluster then keep
        about two windows per worker thread in flight between them, instead of each
        sizing its prefetch on the whole cluster (512 ranks on 4,096 threads would
        otherwise hold 512 x 8,196 windows)."""
        return 2 * self.share(lanes) + 4

    def share(self, lanes: int | None = None) -> int:
        """The :attr:`slots` a consumer of ``lanes`` of the ``canonical_replicas`` lanes counts
        as its own: all of them, or on a :attr:`shared` runner its share (at least 1)."""
        slots = self.slots
        if self.shared and lanes is not None:
            slots = max(1, math.ceil(slots * lanes / self.spec.canonical_replicas))
        return slots

    def _run_local(self, graph: WindowGraph) -> WindowOutput:
        return dask.get(graph.to_dict(self.spec), graph.key)

    def close(self) -> None:
        pass

    def describe(self) -> str:
        return self.name
