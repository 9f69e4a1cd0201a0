"""Dask task graphs for windows: deterministic keys, one graph per (lane, window), or one task
for several windows."""

from .group_graph import GroupGraph, group_graph
from .keys import chunk_key, spec_key, window_key
from .window_graph import WindowGraph, window_graph

__all__ = ["GroupGraph", "WindowGraph", "group_graph", "chunk_key", "spec_key", "window_graph", "window_key"]
