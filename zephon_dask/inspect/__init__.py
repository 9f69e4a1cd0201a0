"""Inspection for notebooks and the command line: plans, previews, lane tables, graphs, HTML views.

Every function here is pure: it reads a pipeline (or a dataset, work source,
batch or state dict) and returns text, HTML or a small value object. Nothing
here starts a runner or a cluster; :func:`preview` computes windows in this
process with ``pipeline.compute_window``.

This package lies below :mod:`zephon_dask.pipeline`: ``Pipeline.explain()``,
``preview()``, ``plan()``, ``window_graph()``, ``stats()`` and its ``repr``
call these functions, which read the pipeline by its public attributes and
never import it. The lower layers' objects (datasets, work sources, batches,
states) reach their HTML through :mod:`zephon_dask.views`, where :mod:`.reprs`
registers it.
"""

from .explain import Explanation, Section, explain
from .graph import WindowGraphView, window_graph
from .plans import PlanEntry, PlanTable, lane_plans, plan_table
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
    "WindowGraphView",
    "batch_html",
    "dataset_html",
    "explain",
    "lane_plans",
    "pipeline_html",
    "pipeline_summary",
    "pipeline_text",
    "plan_table",
    "plot_mixture",
    "plot_packing",
    "preview",
    "source_html",
    "state_html",
    "stats",
    "window_graph",
]
