"""The pipeline definition (builder, spec, fingerprint) and the pure window function."""

from .builder import Pipeline
from .spec import PipelineSpec
from .window import WindowOutput, compute_chunk, compute_window, finish_window

__all__ = ["Pipeline", "PipelineSpec", "WindowOutput", "compute_chunk", "compute_window", "finish_window"]
