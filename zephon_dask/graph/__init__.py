"""Dask task graphs for windows: deterministic keys, one graph per (lane, window)."""

from .keys import chunk_key, spec_key, window_key
from .window_graph import WindowGraph, window_graph

__all__ = ["WindowGraph", "chunk_key", "spec_key", "window_graph", "window_key"]
