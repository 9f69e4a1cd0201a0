"""The Dask graph of several windows computed by one task. Pure: a description.

A :class:`GroupGraph` is one task running
:func:`~zephon_dask.core.window.compute_windows` over its members, consecutive
fused windows in the order the consumer needs them, and returning their
outputs together: one task's scheduling, messages and fetch instead of one per
window (on small windows, Dask's per-task CPU is a fair share of the work).
Each member's bytes are those of its own fused window. It offers what a
runner's handle reads of a :class:`~zephon_dask.graph.WindowGraph`: ``key``,
``task_keys``, ``producer_keys``, ``tasks_for``, ``fused_copy`` and ``label``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from dask.task_spec import Task

from ..core.spec import PipelineSpec
from ..core.window import compute_windows
from .keys import again_key, spec_key, windows_key
from .window_graph import WindowGraph


@dataclass(frozen=True)
class GroupGraph:
    windows: tuple[WindowGraph, ...]
    key: str
    spec_key: str
    fused: bool = True

    @property
    def members(self) -> tuple[tuple[int, int], ...]:
        """The members' ``(lane, window)``, in the order the task computes and returns them."""
        return tuple((g.lane, g.window) for g in self.windows)

    @property
    def label(self) -> str:
        """The windows, for messages: ``windows (lane 3, window 5), (lane 4, window 5)``."""
        return "windows " + ", ".join(f"({g.label})" for g in self.windows)

    @property
    def task_keys(self) -> tuple[str, ...]:
        return (self.key,)

    @property
    def producer_keys(self) -> tuple[str, ...]:
        """The one task reads data, as a fused window does (see :attr:`WindowGraph.producer_keys`)."""
        return (self.key,)

    def tasks_for(self, spec: Any) -> dict[str, Task]:
        """The one task, under :attr:`key`, computing every member from ``spec`` (as in
        :meth:`WindowGraph.tasks_for`)."""
        return {self.key: Task(self.key, compute_windows, spec, self.members)}

    def fused_copy(self, n: int) -> GroupGraph:
        """The same windows under a key of their own (the ``n``-th copy), for computing them again
        beside the original."""
        return replace(self, key=again_key(self.key, n))


def group_graph(spec: PipelineSpec, windows: Sequence[WindowGraph]) -> GroupGraph:
    """One task for ``windows``, fused window graphs of ``spec`` in the order they are needed."""
    members = [(g.lane, g.window) for g in windows]
    return GroupGraph(tuple(windows), windows_key(spec.fingerprint, members), spec_key(spec.fingerprint))
