"""``window_graph(pipeline, lane, window)``: one window's Dask graph, for looking at. Pure.

:class:`WindowGraphView` is the :class:`~zephon_dask.graph.WindowGraph` the
runners submit plus the spec: its table and drawing are made from
:meth:`~zephon_dask.graph.WindowGraph.to_dict`, the tasks the runners execute.
"""

from __future__ import annotations

import importlib.util
import shutil
from dataclasses import dataclass, field, fields

from ..core.spec import PipelineSpec
from ..errors import MissingDependencyError
from ..graph import WindowGraph
from ..graph import window_graph as build_window_graph
from .render import html_block, html_table, text_table

TASK_HEADERS = ("key", "kind", "chunk", "needs")
GRAPHVIZ_FIX = (
    "install the graphviz Python package and the Graphviz programs: "
    "`pip install graphviz` plus `apt install graphviz` / `brew install graphviz` "
    "(or `conda install python-graphviz`); the task table (display the object, or .tasks()) "
    "needs neither"
)


@dataclass(frozen=True)
class WindowGraphView(WindowGraph):
    """A window's graph with its spec: ``tasks()``, ``visualize()`` and an HTML table."""

    spec: PipelineSpec = field(repr=False, compare=False)

    def graph(self) -> dict:
        """The plain Dask graph (``dask.get``-able)."""
        return self.to_dict(self.spec)

    def tasks(self) -> list[dict]:
        """One dict per key of :meth:`graph`, in its order: ``key``, ``kind`` (spec / chunk /
        window / fused-window), ``chunk`` (a chunk task's chunk index) and ``needs`` (the keys
        it depends on, in the graph's order)."""
        dsk = self.graph()
        chunk_of = {} if self.fused else dict(zip(self.chunk_keys, self.chunks, strict=True))
        return [{"key": key, "kind": self.kind(key), "chunk": chunk_of.get(key),
                 "needs": tuple(k for k in dsk if k in node.dependencies)} for key, node in dsk.items()]

    def visualize(self, filename: str | None = None, format: str | None = None, **kwargs):
        """Draw the graph with Dask's graphviz support.

        Without ``filename`` it returns the ``graphviz.Digraph`` (a notebook
        renders it); with one it writes the image and returns Dask's display
        object. ``kwargs`` go to ``dask.dot.to_graphviz``.
        """
        if importlib.util.find_spec("graphviz") is None:
            raise MissingDependencyError(f"visualize() needs the graphviz Python package: {GRAPHVIZ_FIX}")
        if shutil.which("dot") is None:
            raise MissingDependencyError(f"visualize() needs the Graphviz `dot` program: {GRAPHVIZ_FIX}")
        from dask.dot import dot_graph, to_graphviz

        if filename is None:
            return to_graphviz(self.graph(), **kwargs)
        return dot_graph(self.graph(), filename=filename, format=format, **kwargs)

    def _rows(self) -> list[tuple[str, ...]]:
        return [(t["key"], t["kind"], "" if t["chunk"] is None else str(t["chunk"]), ", ".join(t["needs"]))
                for t in self.tasks()]

    def __repr__(self) -> str:
        return self._caption() + "\n" + text_table(TASK_HEADERS, self._rows())

    def _caption(self) -> str:
        return (f"lane {self.lane}, window {self.window}: {len(self.chunks)} chunk(s) "
                f"{list(self.chunks)}, {'fused' if self.fused else 'unfused'}")

    def _repr_html_(self) -> str:
        return html_block(html_table(TASK_HEADERS, self._rows(), caption=self._caption()))


def window_graph(pipeline, lane: int, window: int, fused: bool | None = None) -> WindowGraphView:
    """Lane ``lane``'s window ``window`` of ``pipeline`` as the Dask graph the runners submit;
    ``fused=None`` follows the ``fuse`` option (``.visualize()`` draws it when graphviz is installed).

    Example:
        >>> from zephon_dask.inspect import window_graph  # doctest: +SKIP
        >>> window_graph(pipeline, 0, 0).visualize()  # doctest: +SKIP
    """
    spec = pipeline.spec
    if fused is None:
        fused = bool(pipeline.description.settings["fuse"])
    graph = build_window_graph(spec, lane, window, fused)
    return WindowGraphView(**{f.name: getattr(graph, f.name) for f in fields(graph)}, spec=spec)
