"""Inspection for notebooks and the command line: plans, previews, lane tables, graphs, HTML views.

Every function here is pure: it reads a pipeline (or a dataset, work source,
batch or state dict) and returns text, HTML or a small value object. Nothing
here starts a runner or a cluster; :func:`preview` computes windows in this
process with :func:`zephon_dask.compute_window`. :func:`step_count` (how many global steps
a finite stream gives, :mod:`.counting`) and :func:`phase_plan` (where a mixture
schedule's phases begin) return values instead of views.

This package lies below :mod:`zephon_dask.pipeline`: ``Pipeline.explain()``,
``preview()``, ``stats()`` and its ``repr`` call these functions, which read
the pipeline by its public attributes and never import it; the lane table
(:func:`plan_table`) and one window's graph (:func:`window_graph`) are called
here directly, as functions of the pipeline. The lower layers' objects (datasets, work sources, batches,
states) reach their HTML through :mod:`zephon_dask.views`, where :mod:`.reprs`
registers it.
"""

from .counting import StepCount, step_count
from .explain import Explanation, Section, explain
from .graph import WindowGraphView, window_graph
from .plans import PlanEntry, PlanTable, lane_plans, phase_plan, plan_table
from .plots import plot_mixture, plot_packing
from .preview import Preview, PreviewDocument, PreviewRow, preview
from .reprs import (
    batch_html,
    dataset_html,
    pipeline_html,
    pipeline_summary,
    pipeline_text,
    source_html,
    state_html,
)
from .stats import PipelineStats, stats

__all__ = [
    "Explanation",
    "PlanEntry",
    "PipelineStats",
    "PlanTable",
    "Preview",
    "PreviewDocument",
    "PreviewRow",
    "Section",
    "StepCount",
    "WindowGraphView",
    "batch_html",
    "dataset_html",
    "explain",
    "lane_plans",
    "pipeline_html",
    "pipeline_summary",
    "pipeline_text",
    "phase_plan",
    "plan_table",
    "plot_mixture",
    "plot_packing",
    "preview",
    "source_html",
    "state_html",
    "stats",
    "step_count",
    "window_graph",
]
