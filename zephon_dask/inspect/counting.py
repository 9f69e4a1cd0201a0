"""How many global steps a finite pipeline gives. Holds a cache of pure values (rows per lane).

A lane's batches are its rows (the samples of its windows, in window order)
cut into micro-batches, the last partial one kept unless ``drop_last``. When
every row is one sample of the mixture (:func:`~zephon_dask.operators.base.one_to_one`: no
``filter``, ``pack``, ``stateful`` or ``split_long``), a lane's rows are its
chunks times ``chunk_size``, known without reading data. Otherwise every
window of every lane is computed here, once (the whole stream is read,
tokenized and packed in this process), and the counts are cached by
fingerprint.

With ``drop_last_step`` (the default) a pass ends on a whole global step:
every step holds ``G / R`` batches of every lane, so the steps of a pass are
those every lane completes (:func:`~zephon_dask.state.steps.whole_steps`),
the same at every DP degree, and the batches after them are dropped. Without
it, a DP group takes ``per_rank`` batches per global step from its lanes in
round-robin; the steps of a pass are those every group completes, and the
batches after them (a last, partial step) are counted apart.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

from ..core.spec import PipelineSpec
from ..core.window import compute_window
from ..curriculum.routing import group_lanes
from ..errors import EndlessStreamError, ZephonWarning
from ..operators.base import one_to_one
from ..state import steps

_ROWS: dict[str, tuple[int, ...]] = {}  # spec fingerprint -> rows per lane (a cache of pure values)


@dataclass(frozen=True)
class StepCount:
    """One pass over a finite stream: ``steps`` full global steps (every DP group completes
    them), ``batches`` over all lanes, ``left`` of them after the last full step, and
    ``counted``: whether the windows were computed to know it (else it came from the curriculum).
    ``dropped``: the pass ends on its last whole step (``drop_last_step``), so the ``left``
    batches are never delivered."""

    steps: int
    batches: int
    left: int
    counted: bool
    dropped: bool = False

    def describe(self) -> str:
        """One line, e.g. ``52 global steps (213 batches; 5 dropped after the last whole step)``."""
        text = f"{self.steps:,} global step{'s' if self.steps != 1 else ''} ({self.batches:,} batches"
        if not self.left:
            return text + ")"
        return text + (f"; {self.left} dropped after the last whole step)" if self.dropped
                       else f"; {self.left} left after the last full step)")


def known_rows(spec: PipelineSpec) -> tuple[int, ...] | None:
    """Rows per lane when known without computing a window (one-to-one, or counted before)."""
    if spec.source.num_chunks is None:
        raise EndlessStreamError("this stream never ends (exhausted_policy='repeat'), so it has no step "
                                 "count; set max_repeats or stop_after_passes for a finite one")
    if spec.fingerprint in _ROWS:
        return _ROWS[spec.fingerprint]
    if one_to_one(spec.record_ops, spec.accumulators):
        replicas, size = spec.canonical_replicas, spec.source.chunk_size
        return tuple(len(spec.source.lane_chunks(lane, replicas)) * size for lane in range(replicas))
    return None


def lane_rows(spec: PipelineSpec) -> tuple[int, ...]:
    """Rows per lane: known, or counted by computing every window here (cached)."""
    rows = known_rows(spec)
    if rows is None:
        rows = tuple(sum(len(compute_window(spec, lane, w)) for w in range(spec.num_windows(lane) or 0))
                     for lane in range(spec.canonical_replicas))
        _ROWS[spec.fingerprint] = rows
    return rows


def count_steps(rows: Sequence[int], microbatch: int, drop_last: bool, groups: Sequence[Sequence[int]],
                per_rank: Sequence[int], counted: bool, per_lane: int | None = None) -> StepCount:
    """The :class:`StepCount` of lanes with ``rows`` each, served by ``groups`` (lane lists)
    taking ``per_rank[i]`` batches per global step; ``per_lane``: the pass ends on a whole step
    of that many batches of every lane (``drop_last_step``), else ``None``."""
    lane_batches = [steps.lane_batches(n, microbatch, drop_last) for n in rows]
    total = sum(lane_batches)
    if per_lane is not None:
        whole = steps.whole_steps(rows, microbatch, per_lane)
        return StepCount(whole, total, total - whole * per_lane * len(rows), counted, dropped=True)
    served = [(lanes, p) for lanes, p in zip(groups, per_rank, strict=True) if lanes]  # a group without lanes serves none
    group_batches = [sum(lane_batches[lane] for lane in lanes) for lanes, _ in served]
    full = min(b // p for b, (_, p) in zip(group_batches, served, strict=True))
    return StepCount(full, total, total - full * sum(p for _, p in served), counted)


def step_count(pipeline, compute: bool = True) -> StepCount | None:
    """One pass's :class:`StepCount` at ``pipeline``'s DP degree: full global steps, batches,
    and those left after the last full step, dropped with ``drop_last_step`` (``pipeline.num_steps()``
    is its ``steps``).

    Read from the pipeline's spec, step shape, settings and batch shape.

    Args:
        pipeline: a :class:`~zephon_dask.Pipeline`.
        compute: compute the windows when the count needs them; ``False``
            returns ``None`` then (what ``repr`` and ``explain()`` do).

    Returns:
        A ``StepCount`` (``steps``, ``batches``, ``left``, ``counted``), or
        ``None`` with ``compute=False`` when the windows would be needed.

    Raises:
        EndlessStreamError: the stream never ends.
        ConfigError: the step settings are invalid at this degree.

    Example:
        >>> zephon_dask.inspect.step_count(pipeline)  # doctest: +SKIP
        StepCount(steps=53, batches=213, left=1, counted=True)
    """
    spec = pipeline.spec
    rows = lane_rows(spec) if compute else known_rows(spec)
    if rows is None:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ZephonWarning)  # uneven groups: warned where they run
        shape = pipeline.session.step_shape()
        replicas, degree = spec.canonical_replicas, shape.dp_degree
        groups = group_lanes(replicas, degree, pipeline.description.settings["mapping_strategy"])
    per_rank = [len(lanes) if replicas % degree else shape.per_rank for lanes in groups]
    batch = pipeline.description.batch
    return count_steps(rows, batch.microbatch_size, batch.drop_last, groups, per_rank,
                       counted=not one_to_one(spec.record_ops, spec.accumulators),
                       per_lane=steps.per_lane(shape, replicas) if spec.drop_last_step else None)
