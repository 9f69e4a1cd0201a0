"""``plan_table``: which DP group owns which lanes, for several degrees and both mappings. Pure.

Each entry is :func:`zephon_dask.curriculum.routing.plan` for one
``(dp_degree, mapping)``; a degree above ``canonical_replicas`` is kept as an
entry with its problem instead of failing the whole table. With a global
step set (``global_batches_per_step``, see :mod:`zephon_dask.pipeline.steps`)
each entry says how many batches a rank takes per step, or that the degree
cannot keep the steps.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from .. import views
from ..curriculum import routing
from ..errors import ConfigError, ElasticityWarning
from ..pipeline import steps
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
        return head + "\n" + text_table(HEADERS, [e.cells() for e in self.entries])

    def _repr_html_(self) -> str:
        caption = f"lane plans for canonical_replicas={self.canonical_replicas}"
        if self.mixture is not None:
            caption += f"; mixture: {self.mixture}"
        return html_block(html_table(HEADERS, [e.cells() for e in self.entries], caption=caption))


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
            notes.append(f"{global_batches // degree} batches per rank per step")
    elif batches_per_step is not None:
        try:
            routing.check_step(batches_per_step, degree, replicas)
        except ConfigError:
            notes.append(f"batches_per_step={batches_per_step} x {degree} is not a multiple of "
                         f"{replicas}: steps not elastic")
    return PlanEntry(degree, mapping, plan, tuple(notes))


@views.register("lane_plans")
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


@views.register("plan_table")
def plan_table(pipeline, dp_degrees: Iterable[int] = (1, 2, 4, 8),
               mappings: Sequence[str] = routing.MAPPING_STRATEGIES) -> PlanTable:
    """:func:`lane_plans` for a pipeline's ``canonical_replicas`` and ``batches_per_step``, with its
    mixture's weights (and, weighted by tokens, the tokens per sample) in a header line."""
    options = pipeline.settings
    table = lane_plans(options["canonical_replicas"], dp_degrees, mappings, options.get("batches_per_step"),
                       options.get("global_batches_per_step"))
    return replace(table, mixture=mixture_line(pipeline.work_source))


def mixture_line(source) -> str:
    """``"weighted by tokens: web 0.7 (812.5 tokens/sample), ..."`` or by samples."""
    if source.weight_by == "tokens":
        parts = [f"{n} {float(w):.3g} ({float(s):,.1f} tokens/sample)"
                 for n, w, s in zip(source.names, source.target_weights, source.tokens_per_sample, strict=True)]
    else:
        parts = [f"{n} {float(w):.3g}" for n, w in zip(source.names, source.weights, strict=True)]
    return f"weighted by {source.weight_by}: " + ", ".join(parts)
