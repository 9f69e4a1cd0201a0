"""The schema of a DataLoader worker's state: its format, version and migrations. Pure.

A ``PipelineDataset`` (``pipeline.to_torch_dataset()``) inside torchdata's
``StatefulDataLoader`` checkpoints per process: the worker's identity, the
lanes it serves and a :class:`~.schema.State` of their progress, whose step
is the group's (G, degree and microbatch size) with the worker's share of a
step as ``batches_per_step`` (:func:`worker_shape`).
:meth:`DatasetState.from_dict` is the only place such a dict is read (its
format and version checked, the inner state by ``State.from_dict``), and
:func:`to_dict` the only place one is written; an older version
is brought to :data:`VERSION` by :meth:`DatasetState.migrated`, with the steps
of :data:`MIGRATIONS`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ..errors import StateError
from .schema import State, StepProgress
from .steps import StepShape

FORMAT = "zephon_dask.dataset_state"
VERSION = 3


def worker_shape(shape: StepShape, lanes: list[int], owned: int) -> StepShape:
    """The step of a DataLoader worker serving ``lanes`` of a group that owns ``owned`` lanes and
    steps by ``shape``: the group's G, degree and microbatch size (what a checkpoint records and a
    resume keeps), and as ``per_rank`` the worker's share of each step. A step is whole
    round-robin cycles over the owned lanes, one batch per lane a cycle, so the share is whole.
    The loader's user counts the steps, so a state taken mid-step does not warn."""
    return StepShape(shape.per_rank * len(lanes) // owned, shape.global_batches, shape.dp_degree, False,
                     shape.microbatch, warns_mid_step=False)


def share_step(step: StepProgress, share: StepShape) -> StepProgress:
    """A worker state's ``step`` that counted the worker's own lanes as a step (G = those lanes,
    degree 1: versions 1 and 2) recounted in ``share``, the worker's share of the group's step
    (see :func:`worker_shape`). Its microbatch size becomes 0 (unknown, as for version 1 pipeline
    states): it was not always recorded."""
    delivered = step.global_step * step.batches_per_step + step.batches_in_step
    return replace(step, global_step=delivered // share.per_rank, batches_in_step=delivered % share.per_rank,
                   batches_per_step=share.per_rank, dp_degree=share.dp_degree,
                   global_batches=share.global_batches, microbatch_size=0)


def _recount_step(state: State, share: StepShape) -> State:
    return replace(state, step=share_step(state.step, share))


# version v -> the inner state at v + 1, given the worker's share of the group's step
MIGRATIONS: dict[int, Callable[[State, StepShape], State]] = {
    1: lambda state, share: state,  # 1 -> 2: nothing at this level (the inner state migrates itself)
    2: _recount_step,  # 2 -> 3: the step is the group's, not the worker's own lanes
}


@dataclass(frozen=True)
class DatasetState:
    """One process's ``PipelineDataset`` state: worker ``worker`` of ``num_workers`` (0 of 0 in
    the main process) serving ``lanes`` at ``state`` (``None``: a worker that serves no lane)."""

    worker: Any  # as recorded: the dataset that loads it checks them against its process and lanes
    num_workers: Any
    lanes: Any
    state: State | None
    version: int = VERSION

    @classmethod
    def from_dict(cls, state: Any) -> DatasetState:
        """Check ``state``'s format and version and read it (the inner state not yet migrated
        to this version: :meth:`migrated`)."""
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            raise StateError(f"PipelineDataset.load_state_dict needs a state from PipelineDataset."
                             f"state_dict(), got {type(state).__name__}")
        version = state.get("version")
        if type(version) is not int or not 1 <= version <= VERSION:
            raise StateError(f"the dataset state has version {version!r}; this zephon_dask reads versions 1 "
                             f"to {VERSION}: upgrade zephon_dask to resume from a newer one")
        lanes, inner = state.get("lanes"), state.get("state")
        read = None if lanes == [] and inner is None else State.from_dict(inner, where="the dataset state")
        return cls(state.get("worker"), state.get("num_workers"), lanes, read, version)

    def migrated(self, share: Callable[[], StepShape]) -> DatasetState:
        """This state at :data:`VERSION`; ``share()`` is the worker's share of the group's step
        (:func:`worker_shape`), asked only if a migration needs it."""
        if self.version == VERSION or self.state is None:
            return replace(self, version=VERSION)
        state, shape = self.state, share()
        for version in range(self.version, VERSION):
            state = MIGRATIONS[version](state, shape)
        return replace(self, state=state, version=VERSION)


def to_dict(worker: int, num_workers: int, lanes: list[int], state: dict | None) -> dict:
    """A dataset state in plain builtins, as torchdata stores it: ``state`` is the served lanes'
    ``State.to_dict()`` (``None`` for a worker that serves no lane)."""
    return {"format": FORMAT, "version": VERSION, "worker": worker, "num_workers": num_workers,
            "lanes": list(lanes), "state": state}


def dataset_states(state: Any) -> list[dict]:
    """Every dataset state nested in ``state`` (a torchdata loader state), as dicts."""
    if isinstance(state, dict):
        if state.get("format") == FORMAT:
            return [state]
        return [found for value in state.values() for found in dataset_states(value)]
    return []
