"""Refuse framework wrappers that would re-shard a pipeline, or checkpoint it ahead of the step.
Pure; imports no framework: the frameworks' names it looks for are in :mod:`.frameworks_compat`.

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

:func:`refuse_fetching_ahead` refuses (at the first batch) Lightning's
training loop iterating a pipeline, its dataset or a plain
``to_torch_loader()``: Lightning fetches one batch ahead of the step and saves
the loader's ``state_dict()`` in its checkpoints, so every resume would skip
that batch. Lightning's evaluation loop
saves no loader state and may iterate any of them.
"""

from __future__ import annotations

import inspect
from types import FrameType

from ..errors import ConfigError, ShardingError
from .frameworks_compat import EVALUATION_LOOPS, RESHARDING_WRAPPERS, TRAINING_LOOPS

MAX_DEPTH = 64  # callers examined; the wrappers sit a few frames above the dataset

FIX = ("a zephon_dask pipeline already gives each rank its own lanes, so this would train "
       "some lanes twice and never train others. Hand the pipeline to the framework through "
       "zephon_dask.integrations (hf.ZephonTrainer, lightning.ZephonDataModule, "
       "accelerate.prepare_pipeline), which keep the framework from splitting it again")


def _matches(frame: FrameType, patterns) -> str | None:
    """``module.Class`` of ``frame``'s code if it matches one of ``patterns``, else ``None``."""
    module = frame.f_globals.get("__name__", "")
    qualname = frame.f_code.co_qualname
    for prefix, owner in patterns:
        if module.startswith(prefix) and qualname.startswith(owner):
            return f"{module}.{qualname.split('.')[0]}"
    return None


def _frame_above(depth: int) -> FrameType | None:
    """The frame ``depth`` calls above the caller of this function (``sys._getframe(depth)`` there,
    through the public ``inspect.currentframe``); ``None`` on an interpreter without frames."""
    frame = inspect.currentframe()
    for _ in range(depth + 1):
        frame = frame.f_back if frame is not None else None
    return frame


def resharding_wrapper(depth: int = MAX_DEPTH) -> str | None:
    """``module.qualname`` of the first re-sharding wrapper among the callers, else ``None``."""
    frame = _frame_above(1)
    for _ in range(depth):
        if frame is None:
            return None
        wrapper = _matches(frame, RESHARDING_WRAPPERS)
        if wrapper is not None:
            return wrapper
        frame = frame.f_back
    return None


def fetching_training_loop(depth: int = MAX_DEPTH) -> str | None:
    """Lightning's training loop (``module.Class``) among the callers of the caller's caller, unless
    its evaluation loop comes first, else ``None``. Reads code and module names only: reading a
    frame's locals would keep them alive."""
    frame = _frame_above(2)
    for _ in range(depth):
        if frame is None or _matches(frame, EVALUATION_LOOPS) is not None:
            return None
        loop = _matches(frame, TRAINING_LOOPS)
        if loop is not None:
            return loop
        frame = frame.f_back
    return None


def refuse_resharding() -> None:
    """Raise :class:`ShardingError` if a re-sharding wrapper is iterating the caller."""
    wrapper = resharding_wrapper()
    if wrapper is not None:
        raise ShardingError(f"{wrapper} is splitting a zephon_dask pipeline by rank: {FIX}")


class Refused:
    """An iterator that raises ``error`` at its first ``next()``.

    A refusal found when a framework starts iterating is raised at the first
    batch, not in ``iter()``: Lightning's clean-up after an ``iter()`` that
    raised fails with an error of its own, which would hide this one.
    """

    def __init__(self, error: Exception):
        self.error = error

    def __iter__(self) -> Refused:
        return self

    def __next__(self):
        raise self.error


def refuse_fetching_ahead(what: str) -> Refused | None:
    """A :class:`Refused` iterator (:class:`ConfigError`) if Lightning's training loop iterates
    ``what`` (the caller: a pipeline, its dataset or its plain loader) directly, else ``None``."""
    loop = fetching_training_loop()
    if loop is None:
        return None
    return Refused(ConfigError(
        f"Lightning's training loop ({loop}) is iterating {what} directly: Lightning fetches a batch "
        "ahead of the step and checkpoints the loader's state with it, so every resume would skip "
        "a batch. Pass the pipeline as trainer.fit(model, datamodule=ZephonDataModule(pipeline)) "
        "(zephon_dask.integrations.lightning), whose loader saves the state of the batches trained"
    ))
