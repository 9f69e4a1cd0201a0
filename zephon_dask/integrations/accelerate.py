"""accelerate fed by a pipeline: :func:`prepare_pipeline`. The loader holds the pipeline.

``accelerator.prepare(pipeline.to_torch_loader())`` would rebuild the loader
around accelerate's ``DataLoaderDispatcher`` (rank 0 reads, every rank gets a
slice: the other ranks' lanes are never read) or ``IterableDatasetShard``
(each rank keeps a slice of its own lanes); both are refused with
:class:`~zephon_dask.errors.ShardingError`. :func:`prepare_pipeline` instead
returns an :class:`AcceleratorLoader` that

- moves each batch to ``accelerator.device`` (pinned and non-blocking on CUDA);
- is marked prepared, so ``accelerator.prepare`` passes it through unchanged
  and never splits it again (each rank already reads only its own lanes);
- is registered for checkpointing: ``accelerator.save_state`` writes its state
  (every rank's lanes, gathered; the main process writes it) and
  ``accelerator.load_state`` restores it, so the next batch after a resume is
  the one after the last batch the loop received, computed directly.

An evaluation loader (``prepare_pipeline(..., evaluation=True)``) is not
registered: each evaluation iterates its pipeline from the start, and the
training state never sees it.
"""

from __future__ import annotations

from ..consumer.torch_io import check_device
from ..pipeline.torch_data import PipelineLoader
from .ranks import collective_state


class AcceleratorLoader(PipelineLoader):
    """A :class:`PipelineLoader` on a device, with a rank-gathered state; accelerate leaves it as is."""

    _is_accelerate_prepared = True  # accelerate's own mark: prepare() returns the loader unchanged

    def __init__(self, pipeline, device=None, num_workers: int = 0, **dataloader_kwargs):
        self.device = check_device(device, "accelerator_loader")
        cuda = self.device is not None and self.device.type == "cuda"
        dataloader_kwargs.setdefault("pin_memory", cuda)
        super().__init__(pipeline, num_workers=num_workers, **dataloader_kwargs)

    def __iter__(self):
        batches = super().__iter__()
        if self.device is None:
            return batches
        blocking = not self.pin_memory
        return ({k: v.to(self.device, non_blocking=not blocking) for k, v in batch.items()} for batch in batches)

    def state_dict(self, *, ahead: int | None = None, at_step: int | None = None) -> dict:
        """The data state to checkpoint: every rank's consumed lanes, gathered (a collective).

        Args:
            ahead: as for :meth:`Pipeline.state_dict`; with either argument, this rank's state only.
            at_step: as for :meth:`Pipeline.state_dict`.

        Returns:
            A state dict covering all ranks' lanes.
        """
        if ahead is None and at_step is None:
            return collective_state(self.pipeline)
        return super().state_dict(ahead=ahead, at_step=at_step)


def prepare_pipeline(accelerator, pipeline, num_workers: int = 0, *, evaluation: bool = False,
                     **dataloader_kwargs) -> AcceleratorLoader:
    """The pipeline's loader for ``accelerator``: on its device, never re-sharded, checkpointed
    by ``save_state``/``load_state``. Call it on every rank (after ``Accelerator()``).

    With ``evaluation=True`` it is not registered for checkpointing: every
    ``iter()`` starts the stream from its beginning (or from a state loaded
    into ``pipeline``), whatever the training loop saved or loaded.

    Example:
        >>> from zephon_dask.integrations.accelerate import prepare_pipeline  # doctest: +SKIP
        >>> accelerator = Accelerator()  # doctest: +SKIP
        >>> loader = prepare_pipeline(accelerator, pipeline, num_workers=2)  # doctest: +SKIP
        >>> held_out = prepare_pipeline(accelerator, eval_pipeline, evaluation=True)  # doctest: +SKIP
    """
    if evaluation:
        pipeline.session.serve_evaluation()  # every sample: an evaluation steps no optimizer
    loader = AcceleratorLoader(pipeline, device=accelerator.device, num_workers=num_workers, **dataloader_kwargs)
    loader = accelerator.prepare(loader)
    if not evaluation:
        accelerator.register_for_checkpointing(loader)
    return loader
