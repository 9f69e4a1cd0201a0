"""The Dask graph of one window. Pure: a description, built without a cluster.

Unfused: one task per chunk (read + stateless operators) feeding one window
task (accumulators). Fused: a single task computing the whole window, fewer
scheduler round trips for small windows. Both give the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.spec import PipelineSpec
from ..core.window import compute_chunk, compute_window, finish_window
from .keys import chunk_key, spec_key, window_key


@dataclass(frozen=True)
class WindowGraph:
    lane: int
    window: int
    chunks: tuple[int, ...]
    chunk_keys: tuple[str, ...]
    key: str
    spec_key: str
    fused: bool

    def to_dict(self, spec: PipelineSpec) -> dict:
        """A plain Dask graph (``dask.get``-able), with the spec as a literal."""
        dsk: dict = {self.spec_key: spec}
        if self.fused:
            dsk[self.key] = (compute_window, self.spec_key, self.lane, self.window)
            return dsk
        for k, g in zip(self.chunk_keys, self.chunks, strict=True):
            dsk[k] = (compute_chunk, self.spec_key, g)
        dsk[self.key] = (finish_window, self.spec_key, self.lane, self.window, list(self.chunk_keys))
        return dsk


def window_graph(spec: PipelineSpec, lane: int, window: int, fused: bool = False) -> WindowGraph:
    fp = spec.fingerprint
    chunks = tuple(spec.window_chunks(lane, window))
    keys = () if fused else tuple(chunk_key(fp, lane, window, i) for i in range(len(chunks)))
    return WindowGraph(lane, window, chunks, keys, window_key(fp, lane, window, fused), spec_key(fp), fused)
