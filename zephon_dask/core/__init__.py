"""The data definition and the pure window function: ``PipelineSpec`` and ``compute_window``.

Everything here is pure: a window is a function of the spec, the lane and the
window index, computed with neither Dask nor torch.
"""

from .spec import PipelineSpec
from .window import ChunkOutput, WindowOutput, compute_chunk, compute_window, finish_window

__all__ = ["ChunkOutput", "PipelineSpec", "WindowOutput", "compute_chunk", "compute_window", "finish_window"]
