"""PyTorch Lightning fed by a pipeline: :class:`ZephonDataModule`. Holds the pipeline.

``trainer.fit(module, datamodule=ZephonDataModule(pipeline), ckpt_path=...)``
resumes exactly with no state code:

- the train loader is a :class:`PipelineLoader` (a ``DataLoader`` with
  ``state_dict``/``load_state_dict``), so Lightning saves its state in every
  checkpoint and restores it before the first batch of a resumed fit;
- Lightning fetches one batch ahead of the step; the data module's
  ``on_before_batch_transfer`` hook, which Lightning calls on the batch the
  step is about to use, marks that batch consumed, so the saved state is the
  state after the last batch trained on, never after the one fetched ahead;
- under DDP each rank owns its lanes (Lightning does not split an
  ``IterableDataset``); the loader's ``state_dict`` gathers every rank's
  lanes (a collective: Lightning takes it on every rank and writes rank 0's).
"""

from __future__ import annotations

import pytorch_lightning as pl

from ..pipeline.torch_data import PipelineLoader
from .ranks import collective_state


class LightningLoader(PipelineLoader):
    """A :class:`PipelineLoader` whose state holds every rank's consumed lanes."""

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


class ZephonDataModule(pl.LightningDataModule):
    """A ``LightningDataModule`` whose training data is a zephon_dask pipeline.

    ``loader_kwargs`` go to the ``DataLoader`` (``num_workers``, ``pin_memory``, ...).
    Batches are the pipeline's dicts of tensors (``tokens``, ``labels``, ... plus
    ``lane`` and ``index_in_lane``).

    Example:
        >>> from zephon_dask.integrations.lightning import ZephonDataModule  # doctest: +SKIP
        >>> pl.Trainer(max_steps=1000).fit(model, datamodule=ZephonDataModule(pipeline, num_workers=2))  # doctest: +SKIP
    """

    def __init__(self, pipeline, num_workers: int = 0, **loader_kwargs):
        super().__init__()
        self.pipeline = pipeline
        self.num_workers, self.loader_kwargs = num_workers, loader_kwargs
        self.loader: LightningLoader | None = None

    def train_dataloader(self) -> LightningLoader:
        """The training loader Lightning iterates (a new :class:`LightningLoader` each call).

        Returns:
            A :class:`LightningLoader` over the pipeline.
        """
        self.loader = LightningLoader(self.pipeline, num_workers=self.num_workers, **self.loader_kwargs)
        return self.loader

    def on_before_batch_transfer(self, batch, dataloader_idx: int):
        """Lightning's hook: mark ``batch`` consumed while training, so checkpoints resume after it.

        Args:
            batch: the batch the training step is about to receive.
            dataloader_idx: the loader's index (one loader here).

        Returns:
            ``batch``, unchanged.
        """
        if self.trainer is not None and self.trainer.training:
            self.pipeline.mark_consumed(batch)  # the step's batch, not the one fetched ahead
        return batch
