"""The global random generators at a training step's boundary: torch's CPU generator, every CUDA
device's once CUDA is in use, numpy's global generator and Python's ``random``. Holds state:
:class:`StepRNG`.

A framework can save between the micro-batches of a step (Lightning's mid-step saves, a
checkpoint written on SIGTERM): the weights and the data state are then those of the last
completed step, but the generators have already drawn the step's dropout masks. The
integrations keep the generators as they were when the step began and save those, so a resume
draws what the uninterrupted run drew. Reading a generator's state draws nothing.

A captured state is plain builtins and tensors: a checkpoint holding it loads with
``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import random

import numpy as np
import torch

from .. import torch_dist
from ..log import logger


def capture() -> dict:
    """The generators' states now. CUDA's only once CUDA is initialised: reading it would start
    CUDA in a process that does not use it, and an unused generator has drawn nothing."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss = random.getstate()
    state = {"torch": torch.get_rng_state(),
             "numpy": [str(kind), [int(k) for k in keys], int(pos), int(has_gauss), float(cached)],
             "python": [version, list(internal), gauss]}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = list(torch.cuda.get_rng_state_all())
    return state


def restore(state: dict) -> None:
    """Set the generators to ``state`` (from :func:`capture`). CUDA devices beyond those visible
    now are left out; without CUDA, its states are ignored."""
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    devices = state.get("cuda") or []
    if devices and torch.cuda.is_available():
        for index, device_state in enumerate(devices[:torch.cuda.device_count()]):
            torch.cuda.set_rng_state(device_state, index)


def all_ranks(state: dict) -> list[dict]:
    """Every rank's ``state``, by rank: a collective under an initialised ``torch.distributed``
    with several ranks (every rank calls it), else ``[state]``."""
    dist = torch_dist.initialized(several=True)
    if dist is None:
        return [state]
    states: list = [None] * dist.get_world_size()
    dist.all_gather_object(states, state)
    return states


def this_rank(states: list[dict] | None) -> dict | None:
    """This rank's state among ``states`` (from :func:`all_ranks`); ``None`` when the checkpoint was
    written by another number of ranks (each rank's dropout then follows the generators as seeded)."""
    if not states:
        return None
    dist = torch_dist.initialized(several=True)
    ranks, rank = (1, 0) if dist is None else (dist.get_world_size(), dist.get_rank())
    if len(states) != ranks:
        logger.info("the checkpoint holds the random generators of %d rank(s), this run has %d: they are "
                    "not restored", len(states), ranks)
        return None
    return states[rank]


class StepRNG:
    """The generators as they were when the current training step began, and a state loaded from a
    checkpoint, restored when training resumes."""

    def __init__(self):
        self.boundary: dict | None = None  # captured when the current step's first micro-batch arrived
        self.pending: dict | None = None  # loaded, restored at the next step's beginning

    def step_begins(self) -> None:
        """A step's first micro-batch is about to be trained: restore a loaded state, then keep the
        generators' state as this step's boundary."""
        if self.pending is not None:
            restore(self.pending)
            self.pending = None
        self.boundary = capture()

    def at_boundary(self, mid_step: bool) -> dict:
        """The state to checkpoint with weights of the last completed step: the loaded one not yet
        restored, the step's beginning while ``mid_step`` (part of a step has run), else now."""
        if self.pending is not None:
            return self.pending
        if mid_step and self.boundary is not None:
            return self.boundary
        return capture()

    def load(self, state: dict | None) -> None:
        """Restore ``state`` (``None``: nothing) when the next step begins."""
        self.pending = state
