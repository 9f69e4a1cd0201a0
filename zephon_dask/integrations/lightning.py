"""PyTorch Lightning fed by a pipeline: :class:`ZephonDataModule`. Holds the pipelines and, per
training iteration, which batches the weights have trained on (:class:`TrainedBatches`).

``trainer.fit(module, datamodule=ZephonDataModule(pipeline), ckpt_path=...)``
resumes exactly with no state code:

- identity: in ``setup()``, once Lightning has started ``torch.distributed``,
  every rank's pipelines must take the strategy's data-parallel replica (a
  collective: all ranks raise the same :class:`ConfigError`, none hangs);
- one optimizer step is one global step of the pipeline: when training
  starts (after a checkpoint's data state is loaded, since the state keeps
  its step) ``accumulate_grad_batches`` is set to ``session.step_shape().per_rank``,
  or refused if the user set another value;
- the data state in a checkpoint matches its weights: the train loader is a
  :class:`LightningLoader` whose ``state_dict`` is the state after the
  batches trained before the last optimizer step. Lightning fetches a batch
  ahead of the step and can save between the micro-batches of a step (a
  resumed fit saves ``ModelCheckpoint``'s step again after its first
  micro-batch); gradients are not checkpointed, so those micro-batches are
  trained again after a resume;
- on a resume Lightning's micro-batch count restarts at that optimizer-step
  boundary, so each step accumulates the same batches as in the uninterrupted
  run, also when the DP degree (and so the accumulation) changed;
- under DDP each rank owns its lanes (Lightning does not split an
  ``IterableDataset``); the loader's ``state_dict`` gathers every rank's
  lanes (a collective: Lightning takes it on every rank and writes rank 0's);
- the random generators in a checkpoint are those of the step boundary too
  (:mod:`zephon_dask.integrations.rng`; Lightning saves none): the data module
  keeps them as each step's first micro-batch arrives, saves them (every rank's)
  and restores them before the first micro-batch of a resumed fit, so dropout
  resumes bit for bit from any checkpoint, mid-step ones included;
- ``val_pipeline`` is the validation loader: every evaluation iterates it
  from its start, its state is never saved, and it is not split again;
- :class:`StopOnPreemption` with ``Preemption(at_once=True)`` stops a fit at
  once on SIGTERM, mid-step, with ``OnExceptionCheckpoint`` writing the last
  completed step.
"""

from __future__ import annotations

import inspect

import pytorch_lightning as pl
from pytorch_lightning.callbacks import GradientAccumulationScheduler

from ..errors import ConfigError
from ..pipeline import frameworks_compat
from ..pipeline.guard import Refused
from ..pipeline.torch_data import PipelineDataset, PipelineLoader
from . import rng
from .ranks import check_identity, collective_state


class TrainedBatches:
    """Which of the training iteration's deliveries the weights have trained on. Holds state.

    Fed with the trainer's global step as each batch reaches the training step:
    every batch received before the global step last moved is in the weights.
    """

    def __init__(self):
        self.started = False  # a training iteration is under way
        self.received = 0  # batches the training step received in this iteration
        self.in_weights = 0  # of those, the ones received before the last optimizer step
        self.step = 0  # the global step when the last batch was received

    def begin(self, step: int) -> None:
        """A new iteration starts (its deliveries count from 0) at global step ``step``."""
        self.started, self.received, self.in_weights, self.step = True, 0, 0, step

    def receive(self, step: int) -> bool:
        """The training step receives the next batch at global step ``step``; whether it is the
        first of an optimizer step."""
        first = step != self.step or self.received == 0
        if step != self.step:  # an optimizer step came after the previous batch
            self.in_weights, self.step = self.received, step
        self.received += 1
        return first

    def mid_step(self, step: int) -> bool:
        """Whether part of an optimizer step has run at global step ``step`` (its weights lack a batch
        received)."""
        return self.started and self.trained(step) < self.received

    def trained(self, step: int) -> int:
        """How many deliveries the weights of global step ``step`` include."""
        return self.received if step != self.step else self.in_weights


class LightningLoader(PipelineLoader):
    """The training loader of a :class:`ZephonDataModule`: its state is the trained batches'."""

    follows_training_step = True  # Lightning's fit loop may iterate it (see zephon_dask.pipeline.guard)
    dataset: PipelineDataset

    def __init__(self, datamodule: ZephonDataModule, num_workers: int = 0, **dataloader_kwargs):
        super().__init__(datamodule.pipeline, num_workers=num_workers, **dataloader_kwargs)
        self.dataset.follows_training_step = True  # it iterates inside this loader
        self.datamodule = datamodule

    def __iter__(self):
        try:
            self.datamodule.training_starts()  # Lightning has loaded a checkpoint's state by now
        except ConfigError as e:
            return Refused(e)  # raised at the first batch: Lightning's clean-up of iter() would hide it
        return super().__iter__()

    def state_dict(self, *, ahead: int | None = None, at_step: int | None = None) -> dict:
        """The data state to checkpoint: every rank's lanes after the batches the weights trained on,
        gathered (a collective).

        Args:
            ahead: as for :meth:`Pipeline.state_dict`; with either argument, this rank's state only.
            at_step: as for :meth:`Pipeline.state_dict`.

        Returns:
            A state dict covering all ranks' lanes.
        """
        if ahead is None and at_step is None:
            self.datamodule.mark_trained()
            return collective_state(self.pipeline)
        return super().state_dict(ahead=ahead, at_step=at_step)


class ZephonDataModule(pl.LightningDataModule):
    """A ``LightningDataModule`` whose training (and validation) data are zephon_dask pipelines.

    ``loader_kwargs`` go to both ``DataLoader`` s (``pin_memory``, ...). Batches
    are the pipeline's dicts of tensors (``input_ids``, ``labels``, ... plus
    ``lane`` and ``index_in_lane``). ``accumulate_grad_batches`` is set to
    ``pipeline.session.step_shape().per_rank`` when training starts: leave it unset.

    Example:
        >>> from zephon_dask.integrations.lightning import ZephonDataModule  # doctest: +SKIP
        >>> data = ZephonDataModule(pipeline, val_pipeline=held_out, num_workers=2)  # doctest: +SKIP
        >>> pl.Trainer(max_steps=1000).fit(model, datamodule=data)  # doctest: +SKIP
    """

    def __init__(self, pipeline, num_workers: int = 0, val_pipeline=None, **loader_kwargs):
        super().__init__()
        self.pipeline, self.val_pipeline = pipeline, val_pipeline
        self.num_workers, self.loader_kwargs = num_workers, loader_kwargs
        self.loader: LightningLoader | None = None
        self.batches = TrainedBatches()
        self.rng = rng.StepRNG()
        if val_pipeline is None:  # Lightning sees the default: no validation data, no warning about it
            self.val_dataloader = super().val_dataloader  # type: ignore[method-assign]

    def setup(self, stage: str) -> None:
        """Lightning's hook, on every rank once ``torch.distributed`` is up: refuse pipelines that are
        not the strategy's data-parallel replica (a collective), and fits this module cannot keep exact.

        Args:
            stage: ``"fit"``, ``"validate"``, ...

        Raises:
            ConfigError: a pipeline's ``dp_degree``/``dp_group_id`` differ from the strategy's; the
                ``training_step`` takes ``dataloader_iter``; a ``GradientAccumulationScheduler`` is set.
        """
        trainer = self.trainer
        if trainer is None:
            return
        sampler = getattr(trainer.strategy, "distributed_sampler_kwargs", None) or {"num_replicas": 1, "rank": 0}
        pipelines = {"train": self.pipeline, "val": self.val_pipeline}
        check_identity({role: p for role, p in pipelines.items() if p is not None},
                       sampler["num_replicas"], sampler["rank"], "Lightning's strategy")
        if stage != "fit":
            return
        if "dataloader_iter" in inspect.signature(trainer.lightning_module.training_step).parameters:
            raise ConfigError("ZephonDataModule needs training_step(batch, batch_idx): a training_step "
                              "taking dataloader_iter fetches batches out of its sight, so its checkpoints "
                              "could not hold the state of the batches trained")
        if any(isinstance(c, GradientAccumulationScheduler) for c in getattr(trainer, "callbacks", ())):
            raise ConfigError("ZephonDataModule sets accumulate_grad_batches to one global step of the "
                              "pipeline; a GradientAccumulationScheduler would change it: remove it and "
                              "change global_batches_per_step instead")

    def train_dataloader(self) -> LightningLoader:
        """The training loader Lightning iterates (a new :class:`LightningLoader` each call).

        Returns:
            A :class:`LightningLoader` over the pipeline.
        """
        self.loader = LightningLoader(self, num_workers=self.num_workers, **self.loader_kwargs)
        return self.loader

    def val_dataloader(self) -> PipelineLoader:
        """The validation loader: ``val_pipeline.to_torch_loader()``, iterated from its start by every
        evaluation (Lightning saves no validation loader state).

        Returns:
            A :class:`PipelineLoader` over ``val_pipeline`` (without one, Lightning sees no
            validation data).
        """
        self.val_pipeline.session.serve_evaluation()  # every sample: an evaluation steps no optimizer
        return self.val_pipeline.to_torch_loader(num_workers=self.num_workers, **self.loader_kwargs)

    def training_starts(self) -> None:
        """The training loader begins an iteration: size the accumulation, on a resume restart
        Lightning's micro-batch count at the step boundary, and count deliveries from 0."""
        trainer = self.trainer
        if trainer is None:
            return
        if trainer.lightning_module.automatic_optimization:
            size_accumulation(trainer, self.pipeline)
            if frameworks_compat.fit_restarting(trainer):
                frameworks_compat.restart_accumulation(trainer)
        self.batches.begin(trainer.global_step)

    def mark_trained(self) -> None:
        """Make the pipeline's consumed watermark the batches the weights have trained on."""
        if self.batches.started and self.trainer is not None:
            self.pipeline.session.mark_consumed(self.batches.trained(self.trainer.global_step))

    def state_dict(self) -> dict:
        """Lightning's hook when it writes a checkpoint (on every rank): the random generators of
        every rank as they were at the last completed step (a collective under DDP).

        Returns:
            ``{"rng": [state of rank 0, ...]}``.
        """
        step = self.trainer.global_step if self.trainer is not None else 0
        return {"rng": rng.all_ranks(self.rng.at_boundary(self.batches.mid_step(step)))}

    def load_state_dict(self, state_dict: dict) -> None:
        """Lightning's hook on a checkpoint's state: this rank's generators are restored before the
        first micro-batch the resumed fit trains (checkpoints of another number of ranks: not).

        Args:
            state_dict: what :meth:`state_dict` returned.
        """
        self.rng.load(rng.this_rank(state_dict.get("rng")))

    def on_before_batch_transfer(self, batch, dataloader_idx: int):
        """Lightning's hook on the batch a step is about to use: while training, count it received;
        at a step's first micro-batch, keep the random generators' state (restoring a loaded one).

        Args:
            batch: the batch the training step is about to receive.
            dataloader_idx: the loader's index (one loader here).

        Returns:
            ``batch``, unchanged.
        """
        trainer = self.trainer
        if trainer is not None and trainer.training and self.batches.started:
            self.pipeline.session.mark_consumed(batch)  # checks it is the next delivery, not one fetched ahead
            if self.batches.receive(trainer.global_step):
                self.rng.step_begins()
        return batch


class StopOnPreemption(pl.Callback):
    """With ``stop = zephon_dask.Preemption(at_once=True)``: SIGTERM or SIGINT stops the fit at once,
    mid-step, and ``OnExceptionCheckpoint`` writes the last completed step: its weights (the
    optimizer has not stepped since), the data state and, from :class:`ZephonDataModule`, the random
    generators of that step boundary, so the checkpoint resumes exactly. A signal during an optimizer
    step waits until the step is counted (``on_train_batch_end``).

    Lightning then exits with status 1 (its ``sys.exit(1)`` after a ``KeyboardInterrupt``); the
    signal is in ``stop.exit_code``. Without it, Lightning stops after the current micro-batch.
    One device: under DDP the ranks must stop at the same point, so several ranks are refused.

    Example:
        >>> with zephon_dask.Preemption(at_once=True) as stop:  # doctest: +SKIP
        ...     trainer = pl.Trainer(callbacks=[StopOnPreemption(stop), OnExceptionCheckpoint("ckpt")])
        ...     try:
        ...         trainer.fit(model, datamodule=ZephonDataModule(pipeline), ckpt_path=resume)
        ...     except SystemExit:
        ...         sys.exit(stop.exit_code or 1)
    """

    def __init__(self, stop):
        if not getattr(stop, "at_once", False):
            raise ConfigError("StopOnPreemption(stop) stops a Lightning fit at once: give it "
                              "zephon_dask.Preemption(at_once=True). Without it, Lightning itself stops "
                              "after the current micro-batch and OnExceptionCheckpoint saves")
        self.stop = stop
        self.holding = False

    def setup(self, trainer, pl_module, stage: str) -> None:
        """Refuse a fit whose interruption would save nothing, or whose ranks would stop apart."""
        from pytorch_lightning.callbacks import OnExceptionCheckpoint

        if stage != "fit":
            return
        if not any(isinstance(c, OnExceptionCheckpoint) for c in trainer.callbacks):
            raise ConfigError("StopOnPreemption stops the fit at once, but no checkpoint would be written: "
                              "add OnExceptionCheckpoint(dirpath=...) to the Trainer's callbacks")
        if trainer.world_size > 1:
            raise ConfigError(f"StopOnPreemption stops one process at once; with {trainer.world_size} ranks each "
                              "would stop at another point and the checkpoint's collectives would not match: "
                              "leave it out (Lightning stops every rank after the current micro-batch)")

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        """Hold a signal while the optimizer steps: the weights change."""
        if not self.holding:
            self.stop.hold()
            self.holding = True

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        """The step is counted: a held signal stops the fit now."""
        self._release(handle=True)

    def on_exception(self, trainer, pl_module, exception) -> None:
        """An exception is on its way out of the fit: a held signal is only recorded."""
        self._release(handle=False)

    def teardown(self, trainer, pl_module, stage: str) -> None:
        """The fit has ended: a held signal is only recorded."""
        self._release(handle=False)

    def _release(self, handle: bool) -> None:
        if self.holding:
            self.holding = False
            self.stop.release(handle=handle)


def size_accumulation(trainer, pipeline) -> None:
    """Set ``trainer.accumulate_grad_batches`` to the pipeline's batches per rank in a global step
    (automatic optimization); refuse another value the user set."""
    shape = pipeline.session.step_shape()
    given = trainer.accumulate_grad_batches
    if given == shape.per_rank:
        return
    if given != 1:
        raise ConfigError(
            f"Trainer(accumulate_grad_batches={given}), but one global step of the pipeline is "
            f"{shape.per_rank} micro-batches per rank ({shape.global_batches} over dp_degree="
            f"{shape.dp_degree}): leave accumulate_grad_batches unset (ZephonDataModule sets it once "
            f"DDP is up), or set it to {shape.per_rank}; change the step with global_batches_per_step"
        )
    trainer.accumulate_grad_batches = shape.per_rank
