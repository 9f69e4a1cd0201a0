"""The training-process side: batches, per-lane batching, round-robin, torch tensors."""

from .batch import Batch, BatchOptions, make_batch
from .batcher import LaneBatcher

__all__ = ["Batch", "BatchOptions", "LaneBatcher", "make_batch"]
