"""Hugging Face ``Trainer`` fed by a pipeline: :class:`ZephonTrainer`. Holds the pipeline.

What the stock ``Trainer`` does with ``train_dataset=pipeline.to_torch_dataset()``
and what this subclass does instead:

- the stock loader stacks ``per_device_train_batch_size`` ready-made batches
  into ``[n, microbatch, length]``; here each pipeline batch is one step's
  micro-batch, reduced to the fields the model takes (``input_ids``,
  ``labels``, ``attention_mask``, ``position_ids``: ``.batch(n, labels="hf")``);
- ``accelerator.prepare`` would split the stream again by rank (a pipeline
  already gives each rank its lanes); here the loader is never prepared, and
  the ``Trainer`` moves each batch to its device as usual;
- a resume iterates and drops the batches already trained
  (``skip_first_batches``); here the pipeline's state is saved in every
  ``checkpoint-N`` (``zephon_state.json``, gathered over the ranks) and
  ``train(resume_from_checkpoint=...)`` restores it: the first batch after a
  resume is computed directly, in the same time at any step (``ignore_data_skip``
  is set on the arguments).

The ``Trainer`` draws exactly ``gradient_accumulation_steps`` batches per
optimizer step and saves after the step, so the saved state is the state
after the last batch it trained on.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from transformers import Trainer, TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

from ..errors import ConfigError, StateError
from ..pipeline import Pipeline
from ..pipeline.torch_data import PipelineDataset
from ..state import load_state, save_state
from .ranks import collective_state

STATE_FILE = "zephon_state.json"
MODEL_FIELDS = ("input_ids", "labels", "attention_mask", "position_ids")


def pipeline_of(obj):
    """The :class:`~zephon_dask.Pipeline` behind ``obj`` (a pipeline or ``pipeline.to_torch_dataset()``)."""
    if isinstance(obj, Pipeline):
        return obj
    if isinstance(obj, PipelineDataset):
        return obj.pipeline
    raise ConfigError(f"train_dataset={type(obj).__name__} is not a zephon_dask pipeline; pass the "
                      "Pipeline (or pipeline.to_torch_dataset())")


def checkpoint_state(checkpoint_dir) -> dict:
    """The pipeline state saved in a ``checkpoint-N`` folder by :class:`ZephonTrainer`."""
    path = Path(checkpoint_dir) / STATE_FILE
    if not path.is_file():
        raise StateError(f"{checkpoint_dir} holds no {STATE_FILE}: it was not written by ZephonTrainer, "
                         "so the data position is unknown. Resume from a checkpoint ZephonTrainer saved")
    return load_state(path)


class ModelBatches:
    """Iterates a pipeline loader, yielding each batch reduced to the model's fields."""

    def __init__(self, loader, fields: tuple[str, ...]):
        self.loader, self.fields = loader, fields

    def __iter__(self):
        for batch in self.loader:
            yield {name: batch[name] for name in self.fields}


class _SavePipelineState(TrainerCallback):
    """Writes the pipeline's state into each ``checkpoint-N`` (every rank takes part)."""

    def __init__(self, pipeline):
        self.pipeline = pipeline

    def on_save(self, args, state, control, **kwargs):
        pipeline_state = collective_state(self.pipeline)
        if state.is_world_process_zero:
            folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
            folder.mkdir(parents=True, exist_ok=True)
            save_state(folder / STATE_FILE, pipeline_state)
        return control


class ZephonTrainer(Trainer):
    """``transformers.Trainer`` whose training data is a zephon_dask pipeline.

    ``train_dataset`` is the pipeline (or ``pipeline.to_torch_dataset()``),
    built with ``.batch(microbatch, labels="hf")``; ``per_device_train_batch_size``
    is not used (the pipeline's microbatch is the batch). Set ``max_steps``.
    ``model_fields`` are the batch fields passed to ``model(**batch)``.

    Example:
        >>> from zephon_dask.integrations.hf import ZephonTrainer  # doctest: +SKIP
        >>> trainer = ZephonTrainer(model=model, args=TrainingArguments("out", max_steps=1000),  # doctest: +SKIP
        ...                         train_dataset=pipeline)
        >>> trainer.train()  # doctest: +SKIP
    """

    def __init__(self, model=None, args=None, train_dataset=None, model_fields=MODEL_FIELDS, **kwargs):
        if train_dataset is None:
            raise ConfigError("ZephonTrainer needs train_dataset=<a zephon_dask Pipeline>")
        pipeline = pipeline_of(train_dataset)
        convention = pipeline.batch_options.label_convention
        if convention != "hf":
            raise ConfigError(
                f"the pipeline's batches have labels={pipeline.batch_options.labels!r}; Hugging Face models "
                "shift labels themselves, so they need unshifted ones: .batch(n, labels='hf')"
            )
        super().__init__(model=model, args=args, train_dataset=pipeline, **kwargs)
        self.pipeline = pipeline
        self.model_fields = tuple(model_fields)
        self.args.ignore_data_skip = True  # the pipeline's own state replaces the skip
        self.add_callback(_SavePipelineState(pipeline))

    def get_train_dataloader(self):
        """The pipeline's loader, unprepared (never re-sharded), yielding the model's fields."""
        loader = self.pipeline.to_torch_loader(num_workers=self.args.dataloader_num_workers,
                                               pin_memory=bool(self.args.dataloader_pin_memory
                                                               and torch.cuda.is_available()))
        return ModelBatches(loader, self.model_fields)

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        """``Trainer.train``; a resume also restores the pipeline from the checkpoint."""
        checkpoint = resume_from_checkpoint
        if isinstance(checkpoint, bool):
            checkpoint = get_last_checkpoint(self.args.output_dir) if checkpoint else None
        if checkpoint is not None and os.path.isdir(checkpoint):
            self.pipeline.load_state_dict(checkpoint_state(checkpoint))
        return super().train(resume_from_checkpoint, *args, **kwargs)
