"""TorchTitan fed by a pipeline: :class:`ZephonDataLoader`. The loader holds its pipeline.

TorchTitan's trainer builds its data loader from ``Trainer.Config.dataloader``
(``config.build(dp_world_size=..., dp_rank=..., seq_len=..., local_batch_size=...)``)
and saves it through its ``CheckpointManager`` with ``torch.distributed.checkpoint``
(DCP), under the key ``dataloader``. Its own ``ParallelAwareDataloader`` keeps one
state per DP rank (``dataloader.dp_rank_<r>``) and refuses a checkpoint written at
another DP degree. :class:`ZephonDataLoader` instead

- reads this DP rank's lanes of the pipeline (``dp_degree``/``dp_group_id`` from
  ``dp_world_size``/``dp_rank``, so tensor- and pipeline-parallel peers read the
  same batches) and yields TorchTitan's ``({"input", "positions"}, labels)``
  micro-batches, padded to ``seq_len``;
- saves, on every rank, the same value under one key
  (``dataloader.zephon_dask_state``): the pipeline state of every rank's lanes,
  gathered (a collective) and written as JSON. DCP stores it once; on load every
  rank reads it and resumes its own lanes from it, at any DP degree the pipeline
  allows, with the same global steps.

The trainer draws exactly its gradient-accumulation count of micro-batches per
optimizer step and saves after the step, so the saved state is the state after
the last batch trained on. One optimizer step must be whole global steps of the
pipeline: :func:`configure` sets the batch sizes that make it so.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any

import torch
import tyro
from torchtitan.components.dataloader import BaseDataLoader
from torchtitan.components.loss import IGNORE_INDEX

from ..errors import ConfigError, StateError
from ..pipeline import Pipeline
from ..pipeline.torch_data import PipelineLoader
from ..state import State
from .ranks import collective_state

STATE_KEY = "zephon_dask_state"  # the one key of the loader's state: the same on every rank


class ZephonDataLoader(BaseDataLoader):
    """A TorchTitan data loader over a zephon_dask pipeline, resumable at another DP degree.

    Built by TorchTitan from :class:`ZephonDataLoader.Config` (``Trainer.Config.dataloader``)
    or directly. Batches are ``({"input": tokens, "positions": positions}, labels)``,
    ``[local_batch_size, seq_len]`` each, padded with the pipeline's ``pad_id``, position 0
    and ``ignore_index``. The pipeline must be built with ``.batch(local_batch_size,
    labels=True)`` (next-token targets, as TorchTitan's loss expects).

    Args:
        config: a :class:`ZephonDataLoader.Config` (the pipeline, or a recipe to build it from).
        dp_world_size: the data-parallel degree (TorchTitan's batch mesh size).
        dp_rank: this rank's data-parallel index.
        seq_len: ``training.seq_len``: rows are padded to it; longer rows are refused.
        local_batch_size: the samples per micro-batch TorchTitan expects.
        **kwargs: the rest of what TorchTitan passes (``tokenizer``,
            ``snapshot_every_n_steps``), not used: the pipeline tokenizes and its state
            is exact at every batch.

    Raises:
        ConfigError: no pipeline or recipe, labels not shifted, another ``ignore_index``
            than TorchTitan's, a micro-batch size other than ``local_batch_size``, or rows
            longer than ``seq_len`` (``.pack(n)`` with ``n > seq_len``).

    Example:
        >>> from zephon_dask.integrations.torchtitan import ZephonDataLoader  # doctest: +SKIP
        >>> config.dataloader = ZephonDataLoader.Config(recipe="recipe.toml")  # doctest: +SKIP
    """

    @dataclass(kw_only=True, slots=True)
    class Config(BaseDataLoader.Config):
        """What TorchTitan builds the loader from (``Trainer.Config.dataloader``)."""

        recipe: str = ""
        """A zephon_dask recipe (TOML) to build the pipeline from, if ``pipeline`` is not set."""

        pipeline: Annotated[Pipeline | None, tyro.conf.Suppress] = None
        """A zephon_dask ``Pipeline`` (set in Python; not a command-line option). Typed as
        optional: tyro would otherwise read a default's constructor as command-line options."""

        num_workers: int = 0
        """DataLoader worker processes; a resume may use another count."""

        def to_dict(self) -> dict:
            """The config as plain values (TorchTitan logs it); the pipeline by its fingerprint."""
            pipeline = None if self.pipeline is None else f"Pipeline(fingerprint={self.pipeline.fingerprint()})"
            return {"dataset": self.dataset, "dataset_path": self.dataset_path, "recipe": self.recipe,
                    "pipeline": pipeline, "num_workers": self.num_workers}

    def __init__(self, config: Config, *, dp_world_size: int, dp_rank: int, seq_len: int,
                 local_batch_size: int, **kwargs):
        pipeline = self._pipeline_of(config)
        if pipeline.session.identity() != (dp_world_size, dp_rank):  # tensor/pipeline-parallel ranks share a DP rank
            pipeline = pipeline.options(dp_degree=dp_world_size, dp_group_id=dp_rank)
        self.pipeline = pipeline
        self._owned = pipeline if pipeline is not config.pipeline else None  # closed by close()
        self.seq_len, self.local_batch_size = int(seq_len), int(local_batch_size)
        self._check_batches()
        self.num_workers = config.num_workers

    @staticmethod
    def _pipeline_of(config) -> Pipeline:
        if config.pipeline is not None and config.recipe:
            raise ConfigError(f"ZephonDataLoader.Config has both pipeline= and recipe={config.recipe!r}: "
                              "give one")
        if config.pipeline is not None:
            if not isinstance(config.pipeline, Pipeline):
                raise ConfigError(f"ZephonDataLoader.Config(pipeline=...) needs a zephon_dask Pipeline, got "
                                  f"{type(config.pipeline).__name__}")
            return config.pipeline
        if config.recipe:
            return Pipeline.from_config(config.recipe)
        raise ConfigError("ZephonDataLoader.Config needs pipeline=<a Pipeline> or recipe=<a recipe TOML>, "
                          "e.g. ZephonDataLoader.Config(recipe='recipe.toml')")

    def _check_batches(self) -> None:
        options = self.pipeline.description.batch
        if options.label_convention != "shifted":
            raise ConfigError(f"the pipeline's batches have labels={options.labels!r}; TorchTitan's loss "
                              "takes next-token targets: .batch(n, labels=True)")
        if options.ignore_index != IGNORE_INDEX:
            raise ConfigError(f"the pipeline's ignore_index is {options.ignore_index}, TorchTitan's loss "
                              f"ignores {IGNORE_INDEX}: .batch(n, labels=True, ignore_index={IGNORE_INDEX})")
        if options.microbatch_size != self.local_batch_size:
            raise ConfigError(
                f"TorchTitan asks for micro-batches of {self.local_batch_size} samples (training."
                f"local_batch_size, or the pipeline-parallel microbatch size), but the pipeline's batches "
                f"hold {options.microbatch_size} (.batch({options.microbatch_size})): make them equal, "
                "e.g. with zephon_dask.integrations.torchtitan.configure(config, pipeline)"
            )
        longest = max((op.max_length for op in self.pipeline.description.accumulators if hasattr(op, "max_length")),
                      default=None)
        if longest is not None and longest > self.seq_len:
            raise ConfigError(f"the pipeline packs rows of {longest} tokens (.pack({longest})) but "
                              f"training.seq_len is {self.seq_len}: set seq_len to at least {longest}")

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        """This rank's micro-batches from the resume point: ``({"input", "positions"}, labels)``."""
        # an own generator: starting the iteration draws nothing from the global torch RNG
        loader = PipelineLoader(self.pipeline, num_workers=self.num_workers, generator=torch.Generator())
        for batch in loader:
            yield self._model_batch(batch)

    def _model_batch(self, batch: dict) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        tokens, positions, labels = batch["tokens"], batch["positions"], batch["labels"]
        width = tokens.shape[1]
        if width > self.seq_len:
            raise ConfigError(f"a batch of lane {int(batch['lane'])} has rows of {width} tokens, more than "
                              f"training.seq_len={self.seq_len}: pack rows to at most seq_len (.pack(n))")
        pad = self.seq_len - width
        if pad:
            pad_id = self.pipeline.description.batch.pad_id
            tokens = torch.nn.functional.pad(tokens, (0, pad), value=pad_id)
            positions = torch.nn.functional.pad(positions, (0, pad), value=0)
            labels = torch.nn.functional.pad(labels, (0, pad), value=IGNORE_INDEX)
        return {"input": tokens, "positions": positions}, labels

    def state_dict(self) -> dict[str, Any]:
        """The pipeline state of every rank's lanes, as JSON under one key (a collective).

        Every rank calls it (DCP does, on save and on load) and gets the same value,
        so DCP writes it once and any DP degree can load it.

        Raises:
            ConfigError: the state falls inside a global step of the pipeline: one
                optimizer step is not whole global steps (see :func:`configure`).
        """
        state = collective_state(self.pipeline)
        step = State.from_dict(state).step
        if step.batches_in_step:
            samples = step.global_batches * step.microbatch_size
            raise ConfigError(
                f"the data state is taken {step.batches_in_step} batches into global step "
                f"{step.global_step + 1}: TorchTitan's optimizer step is not whole global steps of the "
                f"pipeline. Set training.global_batch_size to a multiple of {samples} (the samples of "
                "one global step), e.g. with zephon_dask.integrations.torchtitan.configure(config, pipeline)"
            )
        return {STATE_KEY: json.dumps(state, sort_keys=True)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume this rank's lanes from a state written by :meth:`state_dict` at any DP degree.

        Raises:
            StateError: the state was not written by a :class:`ZephonDataLoader`, or it
                does not resume this pipeline (another data configuration, ...).
        """
        if not state_dict:  # TorchTitan: an empty state starts the data afresh
            return
        text = state_dict.get(STATE_KEY)
        if not isinstance(text, str):
            raise StateError(
                f"the checkpoint's dataloader state has keys {sorted(state_dict)}, not {STATE_KEY!r}: it "
                "was not written by ZephonDataLoader. Resume from a checkpoint it wrote, or start the data "
                "afresh with checkpoint.exclude_from_loading=['dataloader']"
            )
        self.pipeline.load_state_dict(json.loads(text))

    def close(self) -> None:
        """Close the pipeline this loader made (from a recipe, or for another DP identity)."""
        if self._owned is not None:
            self._owned.close()


def configure(config, pipeline: Pipeline, num_workers: int = 0):
    """Point a TorchTitan ``Trainer.Config`` at ``pipeline``, with batch sizes that keep its steps.

    Sets ``config.dataloader`` to a :class:`ZephonDataLoader.Config`,
    ``training.local_batch_size`` to the pipeline's micro-batch size and
    ``training.global_batch_size`` to the samples of one global step (G x micro-batch),
    so one optimizer step is one global step of the pipeline at every DP degree.

    Args:
        config: a ``torchtitan.trainer.Trainer.Config`` (changed in place and returned).
        pipeline: the pipeline, built with ``.batch(n, labels=True)``.
        num_workers: DataLoader worker processes per rank.

    Returns:
        ``config``.

    Raises:
        ConfigError: the pipeline sets ``batches_per_step`` (per rank: G would depend on
            the degree; set ``global_batches_per_step``), or pipeline parallelism is on
            (set the sizes by hand: ``pipeline_parallel_microbatch_size`` = the micro-batch).

    Example:
        >>> from zephon_dask.integrations.torchtitan import configure  # doctest: +SKIP
        >>> config = configure(llama3_debugmodel(), pipeline)  # doctest: +SKIP
    """
    if pipeline.description.settings["batches_per_step"] is not None:
        raise ConfigError("configure() needs a global step that is the same at every DP degree: set "
                          ".options(global_batches_per_step=G) instead of batches_per_step")
    if config.parallelism.pipeline_parallel_degree > 1:
        raise ConfigError("with pipeline parallelism TorchTitan reads micro-batches of parallelism."
                          "pipeline_parallel_microbatch_size: set it to the pipeline's micro-batch size and "
                          "training.global_batch_size to G x that size yourself")
    microbatch = pipeline.description.batch.microbatch_size
    config.dataloader = ZephonDataLoader.Config(pipeline=pipeline, num_workers=num_workers)
    config.training.local_batch_size = microbatch
    config.training.global_batch_size = pipeline.session.step_shape().global_batches * microbatch
    return config
