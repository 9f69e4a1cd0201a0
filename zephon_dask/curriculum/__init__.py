"""The pure curriculum: sample order, mixture, chunks, lanes, windows, groups.

Nothing here does I/O or imports dask or torch: every function is a pure
function of the seed and integer indices.
"""

from .routing import Plan, group_lanes, plan, worker_lanes
from .work_source import ChunkPointers, LaneChunks, MixtureWorkSource, Pointer

__all__ = [
    "ChunkPointers",
    "LaneChunks",
    "MixtureWorkSource",
    "Plan",
    "Pointer",
    "group_lanes",
    "plan",
    "worker_lanes",
]
