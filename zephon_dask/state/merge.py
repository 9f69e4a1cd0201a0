"""Joining the per-rank states of one run into a state any topology can resume.

A rank's state holds only the lanes it owns. :func:`merge_states` unions
them; DP peers (ranks that own the same lanes) must agree exactly.
:func:`gather_state` does the same collectively over ``torch.distributed``.
"""

from __future__ import annotations

from dataclasses import replace

from .. import torch_dist
from ..errors import StateError
from .schema import LaneProgress, State


def merge_states(states) -> dict:
    """One state with every lane of ``states`` (pure): the per-rank states of one step, merged.

    Args:
        states: state dicts of the same run and global step (one per rank or DP group).

    Returns:
        A new state holding every lane and round-robin pointer of ``states``.

    Raises:
        StateError: no state, a malformed one, or states of different runs or
            steps, or DP peers that disagree on a lane.

    Example:
        >>> merged = zephon_dask.merge_states([state_rank0, state_rank1])  # doctest: +SKIP
    """
    states = [State.from_dict(s, where=f"state {i}") for i, s in enumerate(states)]
    if not states:
        raise StateError("merge_states needs at least one state")
    first = states[0]
    for i, s in enumerate(states[1:], 1):
        _check_same_run(i, s, first)
    lanes: dict[int, LaneProgress] = {}
    pointers: dict[str, int] = {}
    diverged = []
    for i, s in enumerate(states):
        for lane, progress in s.lanes.items():
            if lanes.setdefault(lane, progress) != progress:
                diverged.append((lane, lanes[lane].to_dict(), progress.to_dict(), i))
        for key, value in s.pointers.items():
            if pointers.setdefault(key, value) != value:
                raise StateError(f"state {i} has round-robin pointer {key!r} -> {value}, another state "
                                 f"-> {pointers[key]}: DP peers diverged")
    if diverged:
        detail = "; ".join(f"lane {lane}: {a} vs {b} (state {i})" for lane, a, b, i in sorted(diverged, key=lambda d: (d[0], d[3]))[:8])
        raise StateError(f"DP peers disagree on lanes {sorted({d[0] for d in diverged})}: {detail}. "
                         "Peers of one DP group must consume the same batches")
    return replace(first, lanes=dict(sorted(lanes.items())), pointers=dict(sorted(pointers.items()))).to_dict()


def _check_same_run(i: int, state: State, first: State) -> None:
    """Refuse state ``i`` unless it has state 0's data and step."""
    for field, mine, theirs in (("fingerprint", state.fingerprint, first.fingerprint),
                                ("step", state.step.to_dict(), first.step.to_dict())):
        if mine != theirs:
            raise StateError(
                f"state {i} has {field} {mine!r} but state 0 has {theirs!r}: the states "
                "come from different runs or were taken at different steps; take them together"
            )


def gather_state(pipeline, group=None) -> dict:
    """Collective: every rank's ``pipeline.state_dict()`` merged, returned on every rank.

    Works with the gloo and nccl backends (with nccl, set the rank's CUDA
    device first, as ``all_gather_object`` requires). Every rank must call it.

    Args:
        pipeline: this rank's pipeline.
        group: the ``torch.distributed`` process group (default: the world).

    Returns:
        The merged state (see :func:`merge_states`).

    Raises:
        StateError: ``torch.distributed`` is not initialised, or the ranks' states
            do not merge.

    Example:
        >>> state = zephon_dask.gather_state(pipeline)  # doctest: +SKIP
        >>> if dist.get_rank() == 0:  # doctest: +SKIP
        ...     zephon_dask.save_state("ckpt/data.json", state)
    """
    dist = torch_dist.initialized()
    if dist is None:
        raise StateError("gather_state needs torch.distributed initialised (init_process_group); "
                         "in a single process use pipeline.state_dict()")
    states = [None] * dist.get_world_size(group)
    dist.all_gather_object(states, pipeline.state_dict(), group=group)
    return merge_states(states)
