"""The training-process side: batches, per-lane batching, round-robin, torch tensors."""

from .batch import Batch, BatchOptions
from .batcher import LaneBatcher
from .cut import make_batch

__all__ = ["Batch", "BatchOptions", "LaneBatcher", "make_batch"]
