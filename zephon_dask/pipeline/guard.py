"""Refuse framework wrappers that would re-shard a pipeline. Pure; imports no framework.

A pipeline already splits its lanes by the ``torch.distributed`` identity:
each rank iterates only its own lanes. A wrapper that splits the stream again
(accelerate's ``IterableDatasetShard`` and ``DataLoaderDispatcher``, the same
shard in ``transformers``) would make every rank train a fraction of its
fraction, or all ranks rank 0's lanes, silently. :func:`refuse_resharding`
looks, when a pipeline dataset starts iterating, for such a wrapper among its
callers and raises :class:`ShardingError`. accelerate's ``DataLoaderShard``
(what ``prepare`` builds in one process) is refused too: it does not split,
but it rebuilds the loader, so the pipeline no longer sees what was
delivered and its state would be wrong. (A ``DistributedSampler`` cannot reach
a pipeline: torch refuses any sampler on an ``IterableDataset``.)
"""

from __future__ import annotations

import sys
from types import FrameType

from ..errors import ShardingError

# (module prefix, qualified-name prefix) of the wrappers that split an iterable stream
RESHARDING_WRAPPERS = (
    ("accelerate.", "IterableDatasetShard."),
    ("accelerate.", "DataLoaderDispatcher."),
    ("accelerate.", "DataLoaderShard."),  # one process: not split, but its deliveries go unrecorded
    ("transformers.", "IterableDatasetShard."),
)
MAX_DEPTH = 64  # callers examined; the wrappers sit a few frames above the dataset

FIX = ("a zephon_dask pipeline already gives each rank its own lanes, so this would train "
       "some lanes twice and never train others. Hand the pipeline to the framework through "
       "zephon_dask.integrations (hf.ZephonTrainer, lightning.ZephonDataModule, "
       "accelerate.prepare_pipeline), which keep the framework from splitting it again")


def resharding_wrapper(depth: int = MAX_DEPTH) -> str | None:
    """``module.qualname`` of the first re-sharding wrapper among the callers, else ``None``."""
    frame: FrameType | None = sys._getframe(1)
    for _ in range(depth):
        if frame is None:
            return None
        module = frame.f_globals.get("__name__", "")
        qualname = frame.f_code.co_qualname
        for prefix, owner in RESHARDING_WRAPPERS:
            if module.startswith(prefix) and qualname.startswith(owner):
                return f"{module}.{qualname.split('.')[0]}"
        frame = frame.f_back
    return None


def refuse_resharding() -> None:
    """Raise :class:`ShardingError` if a re-sharding wrapper is iterating the caller."""
    wrapper = resharding_wrapper()
    if wrapper is not None:
        raise ShardingError(f"{wrapper} is splitting a zephon_dask pipeline by rank: {FIX}")

