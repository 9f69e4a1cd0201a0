"""``plan_table``: which DP group owns which lanes, for several degrees and both mappings. Pure.

Each entry is :func:`zephon_dask.curriculum.routing.plan` for one
``(dp_degree, mapping)``; a degree above ``canonical_replicas`` is kept as an
entry with its problem instead of failing the whole table. With a global
step set (``global_batches_per_step``, see :mod:`zephon_dask.state.steps`)
each entry says how many batches a rank takes per step, or that the degree
cannot keep the steps. A pipeline with a mixture schedule adds a table of its
phases (:func:`phase_rows`): where each one begins in chunk blocks and in global steps.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from ..core import phases
from ..curriculum import routing
from ..errors import ConfigError, ElasticityWarning
from ..state import steps
from ..validate import check_int
from .render import html_block, html_table, text_table


@dataclass(frozen=True)
class PlanEntry:
    """One ``(dp_degree, mapping)``: its :class:`~zephon_dask.curriculum.Plan` or why there is none."""

    dp_degree: int
    mapping: str
    plan: routing.Plan | None
    notes: tuple[str, ...]

    def cells(self) -> tuple[str, ...]:
        """The entry as table cells: degree, mapping, groups, lanes per group, imbalance, notes."""
        if self.plan is None:
            return (str(self.dp_degree), self.mapping, "-", "-", "-", "; ".join(self.notes))
        groups = " | ".join(",".join(map(str, g)) for g in self.plan.groups)
        sizes = sorted({len(g) for g in self.plan.groups})
        per_group = "-".join(map(str, (sizes[0], sizes[-1]))) if len(sizes) > 1 else str(sizes[0])
        return (str(self.dp_degree), self.mapping, groups, per_group, f"{self.plan.imbalance:.2f}",
                "; ".join(self.notes) or "ok")


HEADERS = ("dp_degree", "mapping", "lanes of group 0 | 1 | ...", "lanes/group", "imbalance", "notes")


@dataclass(frozen=True)
class PlanTable:
    """Lane-to-group plans (a value): ``str()`` for a terminal, HTML for a notebook."""

    canonical_replicas: int
    batches_per_step: int | None
    entries: tuple[PlanEntry, ...]
    global_batches: int | None = None
    mixture: str | None = None  # a pipeline's weights, in words (none for a recipe's options alone)
    phases: tuple[tuple[str, ...], ...] = ()

    def __repr__(self) -> str:
        return str(self)

    def __str__(self) -> str:
        head = f"canonical_replicas={self.canonical_replicas}"
        if self.global_batches is not None:
            head += f", global_batches_per_step={self.global_batches}"
        if self.batches_per_step is not None:
            head += f", batches_per_step={self.batches_per_step}"
        if self.mixture is not None:
            head += f"\nmixture: {self.mixture}"
        text = head + "\n" + text_table(HEADERS, [e.cells() for e in self.entries])
        if self.phases:
            text += "\nmixture schedule (the same at every degree)\n" + text_table(PHASE_HEADERS, self.phases)
        return text

    def _repr_html_(self) -> str:
        caption = f"lane plans for canonical_replicas={self.canonical_replicas}"
        if self.mixture is not None:
            caption += f"; mixture: {self.mixture}"
        parts = [html_table(HEADERS, [e.cells() for e in self.entries], caption=caption)]
        if self.phases:
            parts.append(html_table(PHASE_HEADERS, self.phases, caption="mixture schedule (the same at every degree)"))
        return html_block(*parts)


PHASE_HEADERS = ("phase", "requested start", "chunk block", "first chunk", "begins at global step", "weights")


def _begins(plan) -> str:
    if plan.phase == 0:
        return "0"
    if plan.begin_step is None:
        return "unknown"
    if not plan.exact:
        return f"~{float(plan.begin_step):,.1f} (estimated: rows are not samples)"
    whole = int(plan.begin_step)
    return f"{whole:,}" if whole == plan.begin_step else f"{whole:,} (mid-step)"


def phase_plan(pipeline, estimate: bool = True) -> list[phases.PhasePlan]:
    """Where each schedule phase of ``pipeline`` begins: requested step, chunk block, and the
    global step (exact when rows are samples in stream order, else estimated; see
    ``docs/concepts.md``).

    Args:
        pipeline: a :class:`~zephon_dask.Pipeline`.
        estimate: measure every phase's rows per sample, so each begin step is set.

    Returns:
        A list of :class:`~zephon_dask.core.phases.PhasePlan` (empty without a schedule).

    Example:
        >>> [(p.step, p.block, p.begin_step) for p in zephon_dask.inspect.phase_plan(pipeline)]  # doctest: +SKIP
        [(0, 0, Fraction(0, 1)), (50000, 4883, Fraction(50000, 1))]
    """
    spec = pipeline.spec
    source = spec.source
    if source.phases is None:
        return []
    return phases.plan(spec, pipeline.session.step_shape().global_batches, pipeline.description.batch.microbatch_size,
                       dict(enumerate(source.phase_chunks or ())), estimate)


def phase_rows(pipeline) -> tuple[tuple[str, ...], ...]:
    """One row per schedule phase of ``pipeline`` (none without a schedule)."""
    source = pipeline.spec.source
    rows = []
    for plan in phase_plan(pipeline):
        assert source.phases is not None
        requested = f"step {plan.step:,}" if plan.step is not None else f"chunk {source.phases[plan.phase].start:,}"
        weights = ", ".join(f"{n} {float(w):.3g}" for n, w in zip(source.names, source.phases[plan.phase].weights,
                                                                   strict=True) if w > 0)
        if source.weight_by == "tokens":
            weights += " (of tokens)"
        rows.append((str(plan.phase), requested, f"{plan.block:,}", f"{plan.chunk:,}", _begins(plan), weights))
    return tuple(rows)


def _entry(replicas: int, degree: int, mapping: str, batches_per_step: int | None,
           global_batches: int | None = None) -> PlanEntry:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ElasticityWarning)
            plan = routing.plan(replicas, degree, mapping)
    except ConfigError as exc:
        return PlanEntry(degree, mapping, None, (str(exc),))
    notes = []
    if replicas % degree:
        notes.append(f"{replicas} lanes do not divide into {degree} groups")
    if global_batches is not None:
        if global_batches % degree or replicas % degree:
            notes.append(f"{global_batches} batches per global step do not split over {degree} groups: "
                         f"refused (valid: {steps.valid_degrees(replicas, global_batches)})")
        else:
            per_rank = global_batches // degree
            notes.append(f"{per_rank} batch{'es' if per_rank != 1 else ''} per rank per step")
    elif batches_per_step is not None:
        try:
            routing.check_step(batches_per_step, degree, replicas)
        except ConfigError:
            notes.append(f"batches_per_step={batches_per_step} x {degree} is not a multiple of "
                         f"{replicas}: steps not elastic")
    return PlanEntry(degree, mapping, plan, tuple(notes))


def lane_plans(canonical_replicas: int, dp_degrees: Iterable[int],
               mappings: Sequence[str] = routing.MAPPING_STRATEGIES,
               batches_per_step: int | None = None, global_batches: int | None = None) -> PlanTable:
    """Plans for every degree in ``dp_degrees`` (in that order) and every mapping."""
    routing.check_replicas(canonical_replicas)
    degrees = [check_int(d, "dp_degrees entry", 1, hint="e.g. [1, 2, 4, 8]") for d in dp_degrees]
    if not degrees:
        raise ConfigError("dp_degrees=[] names no degree; give positive ints, e.g. [1, 2, 4, 8]")
    for m in mappings:
        routing.check_choice(m, routing.MAPPING_STRATEGIES, "mapping_strategy")
    if global_batches is not None:
        steps.check_global(global_batches, canonical_replicas)
    entries = tuple(_entry(canonical_replicas, d, m, batches_per_step, global_batches)
                    for d in degrees for m in mappings)
    return PlanTable(canonical_replicas, batches_per_step, entries, global_batches)


def plan_table(pipeline, dp_degrees: Iterable[int] = (1, 2, 4, 8),
               mappings: Sequence[str] = routing.MAPPING_STRATEGIES) -> PlanTable:
    """The lane-to-group table of ``pipeline`` for each DP degree and mapping, with load imbalance:
    :func:`lane_plans` for its ``canonical_replicas`` and step settings, with its mixture's weights
    (and, weighted by tokens, the tokens per sample) in a header line.

    Example:
        >>> from zephon_dask.inspect import plan_table  # doctest: +SKIP
        >>> plan_table(pipeline, dp_degrees=(2, 4))  # doctest: +SKIP
    """
    options = pipeline.description.settings
    table = lane_plans(options["canonical_replicas"], dp_degrees, mappings, options.get("batches_per_step"),
                       options.get("global_batches_per_step"))
    return replace(table, mixture=mixture_line(pipeline.spec.source), phases=phase_rows(pipeline))


def mixture_line(source) -> str:
    """``"weighted by tokens: web 0.7 (812.5 tokens/sample), ..."`` or by samples."""
    if source.weight_by == "tokens":
        parts = [f"{n} {float(w):.3g} ({float(s):,.1f} tokens/sample)"
                 for n, w, s in zip(source.names, source.target_weights, source.tokens_per_sample, strict=True)]
    else:
        parts = [f"{n} {float(w):.3g}" for n, w in zip(source.names, source.weights, strict=True)]
    first = "" if source.phases is None else " (the first schedule phase)"
    return f"weighted by {source.weight_by}{first}: " + ", ".join(parts)
