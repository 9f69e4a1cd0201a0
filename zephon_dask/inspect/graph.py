"""``window_graph(pipeline, lane, window)``: one window's Dask graph, for looking at. Pure.

:class:`WindowGraphView` is the :class:`~zephon_dask.graph.WindowGraph` the
runners submit (same keys, same tasks) plus the spec, so it can list its tasks
as a table and draw itself with Dask's graphviz support.
"""

from __future__ import annotations

import importlib.util
import shutil
from dataclasses import dataclass, field, fields

from ..errors import MissingDependencyError
from ..graph import WindowGraph
from ..graph import window_graph as build_window_graph
from ..core.spec import PipelineSpec
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
        """One dict per key: ``key``, ``kind`` (spec / chunk / window / fused-window), ``chunk``, ``needs``."""
        out = [{"key": self.spec_key, "kind": "spec", "chunk": None, "needs": ()}]
        if not self.fused:
            out += [{"key": k, "kind": "chunk", "chunk": g, "needs": (self.spec_key,)}
                    for k, g in zip(self.chunk_keys, self.chunks, strict=True)]
        kind = "fused-window" if self.fused else "window"
        out.append({"key": self.key, "kind": kind, "chunk": None,
                    "needs": (self.spec_key, *self.chunk_keys)})
        return out

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
    """Lane ``lane``'s window ``window`` as a graph; ``fused=None`` follows the ``fuse`` option."""
    spec = pipeline.spec
    if fused is None:
        fused = bool(pipeline._options["fuse"])
    graph = build_window_graph(spec, lane, window, fused)
    return WindowGraphView(**{f.name: getattr(graph, f.name) for f in fields(graph)}, spec=spec)
