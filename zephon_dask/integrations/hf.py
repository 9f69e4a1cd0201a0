"""Hugging Face ``Trainer`` and its subclasses (TRL's ``SFTTrainer``, ...) fed by pipelines:
:class:`ZephonTrainerMixin` and ``ZephonTrainer = ZephonTrainerMixin + Trainer``. The trainer holds
its training pipeline and its evaluation pipelines.

What the stock ``Trainer`` would do with a pipeline and what the mixin does instead:

- **training**: each pipeline batch is one micro-batch, reduced to the fields the
  model takes (``input_ids``, ``labels``, ``attention_mask``, ``position_ids``:
  ``.batch(n, labels="hf")``); the loader is never passed to ``accelerator.prepare``
  (a pipeline already gives each rank its lanes), and the ``Trainer`` moves each
  batch to its device as usual;
- **steps**: ``gradient_accumulation_steps`` is the pipeline's batches per rank per
  global step, set again after a resume has loaded the checkpoint's state (which
  keeps the samples per global step, so another microbatch size changes it), and
  ``per_device_train_batch_size`` is the microbatch size, so the logged batch
  sizes and samples per second are the real ones;
- **resume**: the pipeline's state is saved in every ``checkpoint-N``
  (``zephon_state.json``, gathered over the ranks) and
  ``train(resume_from_checkpoint=...)`` restores it; nothing is skipped
  (``ignore_data_skip`` is set), and the logged ``epoch`` goes on from the checkpoint's;
- **evaluation**: an evaluation pipeline (``eval_dataset=``, or a dict of them) is
  read from its beginning at every evaluation, each rank reading its own lanes,
  with no effect on the training pipeline or the random number generators;
  ``eval_loss`` is the mean loss per label token over every rank's batches;
- **preemption**: :class:`StopOnPreemption` saves a checkpoint and stops at the end of
  the optimizer step during which SIGINT or SIGTERM arrived, or with
  ``Preemption(at_once=True)`` at once, mid-step, as ``checkpoint-N`` of the last
  completed step N with that step boundary's data and random generators (the
  stock ``Trainer`` has no handler: SIGTERM ends the process with nothing saved);
- **TRL**: trainers that accept only a ``datasets`` object and prepare it
  themselves (tokenizing, packing) get a one-row stand-in in ``__init__``; the
  pipelines replace it before anything reads data, so TRL never prepares them.

The ``Trainer`` draws exactly ``gradient_accumulation_steps`` batches per
optimizer step and saves after the step, so the saved state is the state
after the last batch it trained on.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import Trainer, TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint, speed_metrics

from .. import torch_dist
from ..errors import ConfigError, StateError
from ..log import logger
from ..pipeline import Pipeline
from ..pipeline.torch_data import PipelineDataset
from ..state import load_state, save_state
from . import rng
from .forward import extra_fields, forward_fields
from .ranks import collective_state

STATE_FILE = "zephon_state.json"
MODEL_FIELDS = ("input_ids", "labels", "attention_mask", "position_ids")
IGNORE_INDEX = -100  # what Hugging Face losses ignore
# TrainingArguments of trainers that prepare data themselves, and what the pipeline does instead
PREPARED_BY_PIPELINE = {
    "packing": "the pipeline packs its rows (.pack(...))",
    "assistant_only_loss": "the pipeline's .tokenize_chat(loss_on=...) puts ignore_index on the tokens not trained",
    "completion_only_loss": "the pipeline's .tokenize_chat(loss_on=...) puts ignore_index on the tokens not trained",
}


def is_pipeline(obj) -> bool:
    """Whether ``obj`` is a pipeline or ``pipeline.to_torch_dataset()``."""
    return isinstance(obj, (Pipeline, PipelineDataset))


def pipeline_of(obj, where: str = "train_dataset"):
    """The :class:`~zephon_dask.Pipeline` behind ``obj`` (a pipeline or ``pipeline.to_torch_dataset()``)."""
    if isinstance(obj, Pipeline):
        return obj
    if isinstance(obj, PipelineDataset):
        return obj.pipeline
    raise ConfigError(f"{where}={type(obj).__name__} is not a zephon_dask pipeline; pass the "
                      "Pipeline (or pipeline.to_torch_dataset())")


def check_hf_labels(pipeline, where: str) -> None:
    """Refuse a pipeline whose labels a Hugging Face model cannot take."""
    options = pipeline.description.batch
    if options.label_convention != "hf":
        raise ConfigError(
            f"the {where} pipeline's batches have labels={options.labels!r}; Hugging Face models "
            "shift labels themselves, so they need unshifted ones: .batch(n, labels='hf')"
        )
    if options.ignore_index != IGNORE_INDEX:
        raise ConfigError(f"the {where} pipeline has .batch(ignore_index={options.ignore_index}); Hugging Face "
                          f"losses ignore {IGNORE_INDEX}: .batch(n, labels='hf', ignore_index={IGNORE_INDEX})")


def checkpoint_state(checkpoint_dir) -> dict:
    """The pipeline state saved in a ``checkpoint-N`` folder by :class:`ZephonTrainerMixin`; a folder
    without one is refused, naming the latest earlier ``checkpoint-M`` beside it that has one."""
    path = Path(checkpoint_dir) / STATE_FILE
    if not path.is_file():
        earlier = earlier_with_state(Path(checkpoint_dir))
        fix = (f"{earlier} has one: resume from it (train(resume_from_checkpoint={str(earlier)!r}))"
               if earlier is not None else
               f"no earlier {PREFIX_CHECKPOINT_DIR}-N beside it has one: resume from a checkpoint a "
               "ZephonTrainer saved")
        raise StateError(
            f"{path} is missing, so the data position of {checkpoint_dir} is unknown. The trainer writes it "
            f"after the weights, so a run stopped in between leaves a {PREFIX_CHECKPOINT_DIR}-N without it "
            f"(as does a trainer other than ZephonTrainer); {fix}")
    return load_state(path)


def earlier_with_state(checkpoint_dir: Path) -> Path | None:
    """The ``checkpoint-M`` folder beside ``checkpoint_dir`` (a ``checkpoint-N``) with the largest
    M < N that holds a pipeline state; ``None`` if none does (or ``checkpoint_dir`` is not so named)."""
    def step(folder: Path) -> int | None:
        number = folder.name.removeprefix(f"{PREFIX_CHECKPOINT_DIR}-")
        return int(number) if number != folder.name and number.isascii() and number.isdigit() else None

    last = step(checkpoint_dir)
    if last is None or not checkpoint_dir.parent.is_dir():
        return None
    found = [(n, folder) for folder in checkpoint_dir.parent.iterdir()
             if (n := step(folder)) is not None and n < last and (folder / STATE_FILE).is_file()]
    return max(found)[1] if found else None


class ModelBatches:
    """Iterates a pipeline loader, yielding each batch reduced to the model's fields and the extra
    per-token fields (which the trainer's ``compute_loss`` takes off before the model sees them)."""

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


class _StreamEpoch(TrainerCallback):
    """Keeps ``state.epoch`` (logged and saved) the share of ``max_steps`` trained, as the Trainer
    counts it over a stream from the start. On a resume the Trainer skips no batch
    (``ignore_data_skip``), so it would count the epoch again from 0."""

    def on_step_end(self, args, state, control, **kwargs):
        if state.max_steps > 0:
            state.epoch = state.global_step / state.max_steps
        return control


class StopOnPreemption(TrainerCallback):
    """Save ``checkpoint-N`` and stop at the end of the optimizer step during which ``stop`` (a
    :class:`~zephon_dask.Preemption`) received SIGINT or SIGTERM; every rank stops at the same step.

    With ``Preemption(at_once=True)`` (one process) the signal stops training at once, mid-step:
    ``checkpoint-N`` of the last completed step N is written from the signal handler (the weights,
    optimizer and scheduler of step N, since the optimizer has not stepped; the data state and the
    random generators as step N ended) and :class:`~zephon_dask.Preempted` is raised, so a step
    longer than the grace period still leaves its checkpoint. A signal during the optimizer step,
    or the evaluation and save after it, waits until the next step begins.

    Example:
        >>> with zephon_dask.Preemption() as stop:  # doctest: +SKIP
        ...     ZephonTrainer(..., callbacks=[StopOnPreemption(stop)]).train(resume_from_checkpoint=...)
        >>> sys.exit(stop.exit_code)  # doctest: +SKIP
    """

    def __init__(self, stop):
        self.stop = stop
        self.trainer: ZephonTrainerMixin | None = None  # set by the trainer it is given to
        self.boundary: dict | None = None  # the random generators as the current step began
        self.mid_step = False  # part of the current step has run
        self.holding = False

    def on_train_begin(self, args, state, control, **kwargs):
        """At once: check the set-up, then hold signals until the first step begins (a resumed
        checkpoint's generators are restored by then)."""
        if not self.stop.at_once:
            return control
        if self.trainer is None:
            raise ConfigError("StopOnPreemption(Preemption(at_once=True)) writes the checkpoint itself and needs "
                              "a ZephonTrainer (or a ZephonTrainerMixin subclass)")
        if torch_dist.initialized(several=True) is not None:
            raise ConfigError("StopOnPreemption(Preemption(at_once=True)) saves from one process's signal handler; "
                              "under torch.distributed the ranks must stop at the same step: use Preemption()")
        self.mid_step = False
        self._hold()
        self.stop.before_raise(self._save)
        return control

    def on_step_begin(self, args, state, control, **kwargs):
        """At once: a held signal stops training here (at the step boundary); else keep the
        generators as this step begins."""
        if self.stop.at_once:
            self._release(handle=True)
            self.boundary, self.mid_step = rng.capture(), True
        return control

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        """At once: hold a signal from here (the weights change) to the next step's beginning."""
        if self.stop.at_once:
            self.mid_step = False
            self._hold()
        return control

    def on_step_end(self, args, state, control, **kwargs):
        """The Trainer's hook after each optimizer step: ask it to save and stop once any rank has
        been signalled."""
        if not self.stop.at_once and self.stop.should_stop():  # a collective under torch.distributed
            control.should_save = control.should_training_stop = True
        return control

    def on_train_end(self, args, state, control, **kwargs):
        """Training has ended: see :meth:`detach`."""
        self.detach()
        return control

    def detach(self) -> None:
        """Training has ended: a held signal is only recorded, and no checkpoint is written for it."""
        self._release(handle=False)
        self.stop.before_raise(self._save, add=False)

    def _hold(self) -> None:
        if not self.holding:
            self.stop.hold()
            self.holding = True

    def _release(self, handle: bool) -> None:
        if self.holding:
            self.holding = False
            self.stop.release(handle=handle)

    def _save(self, signum: int) -> None:
        if self.trainer is not None:
            self.trainer.save_step_boundary(self.boundary if self.mid_step else None)


def stand_in(fields: tuple[str, ...]):
    """A one-row ``datasets.IterableDataset`` with the model's fields, for a trainer's ``__init__`` that
    accepts only ``datasets`` objects and looks at their first row (TRL's); ``None`` without ``datasets``.
    In memory: no cache file is written."""
    try:
        import datasets
    except ImportError:
        return None
    features = datasets.Features({name: datasets.Sequence(datasets.Value("int64")) for name in fields})
    row = {name: [[IGNORE_INDEX] * 2 if name == "labels" else [0, 0]] for name in fields}
    return datasets.Dataset.from_dict(row, features=features).to_iterable_dataset()


def _blank(fields: tuple[str, ...], like: dict | None, device) -> dict:
    """A batch with no label token: ``like``'s first row, or a two-token row. A rank whose evaluation
    stream ended runs it while others still evaluate, so that every rank makes the same collectives."""
    if like is not None:
        return {k: torch.full_like(v[:1], IGNORE_INDEX) if k == "labels" else v[:1].clone() for k, v in like.items()}
    fill = {"labels": IGNORE_INDEX, "attention_mask": 1}
    out = {k: torch.full((1, 2), fill.get(k, 0), dtype=torch.long, device=device) for k in fields}
    if "position_ids" in out:
        out["position_ids"] = torch.arange(2, device=device)[None]
    return out


if TYPE_CHECKING:  # the mixin's attributes are the Trainer's
    from transformers import Trainer as _TrainerBase
else:
    _TrainerBase = object


class ZephonTrainerMixin(_TrainerBase):
    """Makes a ``transformers.Trainer`` (or a subclass: TRL's ``SFTTrainer``, ...) train and
    evaluate on zephon_dask pipelines. List it first: ``class MySFT(ZephonTrainerMixin, SFTTrainer)``.

    ``train_dataset`` is the pipeline (or ``pipeline.to_torch_dataset()``), built with
    ``.batch(microbatch, labels="hf")``; set ``max_steps`` (a stream has no length).
    ``gradient_accumulation_steps`` (the pipeline's batches per rank per global step)
    and ``per_device_train_batch_size`` (its microbatch size) are set here.
    ``eval_dataset`` may be a finite pipeline or a dict of them (mixed with other
    datasets); each evaluation reads it from the beginning. ``model_fields`` are the
    batch fields passed to ``model(**batch)``; by default those its ``forward`` takes
    (:func:`~zephon_dask.integrations.forward.forward_fields`). The batch's other per-token
    fields (``tokenize(keep=[...])``, ``dataset_ids``) reach ``compute_loss(model, inputs)``
    in ``inputs`` (a subclass overriding it reads e.g. ``inputs["domain"]`` for a per-domain
    loss) and are taken off there, kept in ``trainer.batch_extras``, before the model runs.

    Example:
        >>> from zephon_dask.integrations.hf import ZephonTrainer  # doctest: +SKIP
        >>> trainer = ZephonTrainer(model=model, args=TrainingArguments("out", max_steps=1000),  # doctest: +SKIP
        ...                         train_dataset=pipeline, eval_dataset=held_out)
        >>> trainer.train()  # doctest: +SKIP
    """

    eval_dataset: Any  # set by the Trainer, replaced here
    control: Any

    def __init_subclass__(cls, **kwargs):
        """Refuse, where the class is defined, a ``Trainer`` class listed before the mixin: its methods
        would replace the mixin's (``__init__``, ``train``, ``get_train_dataloader``)."""
        super().__init_subclass__(**kwargs)
        mro = cls.__mro__
        before = [k for k in mro[1:mro.index(ZephonTrainerMixin)]
                  if issubclass(k, Trainer) and not issubclass(k, ZephonTrainerMixin)]
        if before:
            mixins = [b for b in cls.__bases__ if issubclass(b, ZephonTrainerMixin)]
            bases = ", ".join(b.__name__ for b in mixins + [b for b in cls.__bases__ if b not in mixins])
            raise ConfigError(
                f"{cls.__name__} lists {before[0].__name__} before ZephonTrainerMixin, so {before[0].__name__}'s "
                f"methods (__init__, train, get_train_dataloader) replace the mixin's and the pipeline is not "
                f"used. List the mixin first: class {cls.__name__}({bases})")

    def __init__(self, model=None, args=None, *, train_dataset=None, eval_dataset=None,
                 model_fields=None, **kwargs):
        if train_dataset is None:
            raise ConfigError(f"{type(self).__name__} needs train_dataset=<a zephon_dask Pipeline>")
        pipeline = pipeline_of(train_dataset)
        check_hf_labels(pipeline, "train_dataset")
        if args is None or args.max_steps <= 0:
            raise ConfigError(f"{type(self).__name__} needs args with max_steps > 0 (got "
                              f"{None if args is None else args.max_steps}): a pipeline is a stream, so the "
                              "number of steps cannot come from its length")
        for name, why in PREPARED_BY_PIPELINE.items():
            if getattr(args, name, False):
                raise ConfigError(f"{type(args).__name__}({name}=True) would have the trainer prepare the data, "
                                  f"but {why}: set {name}=False")
        self.pipeline = pipeline
        self.extra_fields = extra_fields(pipeline)
        self.model_fields = tuple(model_fields) if model_fields is not None else (
            forward_fields(model, MODEL_FIELDS + self.extra_fields) if model is not None else MODEL_FIELDS)
        self.batch_extras: dict = {}
        for name, evaluated in self._eval_pipelines(eval_dataset).items():
            self._check_eval(evaluated, f"eval_dataset[{name!r}]" if name else "eval_dataset",
                             kwargs.get("compute_metrics"))
        blank = stand_in(self.model_fields)
        super().__init__(model=model, args=args,
                         train_dataset=pipeline if blank is None else blank,
                         eval_dataset=self._swap(eval_dataset, blank), **kwargs)
        self.train_dataset = pipeline
        self.eval_dataset = self._swap(eval_dataset, None, prepared=self.eval_dataset)
        self.args.ignore_data_skip = True  # the pipeline's own state replaces the skip
        self._match_step(given=args.gradient_accumulation_steps)
        self.add_callback(_SavePipelineState(pipeline))
        self.callback_handler.callbacks.insert(0, _StreamEpoch())  # first: the callbacks after it read the epoch

    # -- the datasets -----------------------------------------------------------------------

    @staticmethod
    def _eval_pipelines(eval_dataset) -> dict:
        """The evaluation pipelines among ``eval_dataset`` (one, or a dict), by name."""
        named = eval_dataset if isinstance(eval_dataset, dict) else {"": eval_dataset}
        return {name: pipeline_of(d, "eval_dataset") for name, d in named.items() if is_pipeline(d)}

    @staticmethod
    def _swap(eval_dataset, blank, prepared=None):
        """``eval_dataset`` with each pipeline replaced by ``blank`` (``None``: kept) and every other
        dataset by its ``prepared`` counterpart (what the base class made of it), if given."""
        if isinstance(eval_dataset, dict):
            kept = prepared if isinstance(prepared, dict) else eval_dataset
            return {k: (d if blank is None else blank) if is_pipeline(d) else kept[k] for k, d in eval_dataset.items()}
        if is_pipeline(eval_dataset):
            return eval_dataset if blank is None else blank
        return eval_dataset if prepared is None else prepared

    def _check_eval(self, pipeline, where: str, compute_metrics) -> None:
        """Refuse an evaluation pipeline (``where``: how the user named it) that cannot be evaluated
        from its start, over and over."""
        check_hf_labels(pipeline, where)
        if pipeline is self.pipeline:
            raise ConfigError(f"{where} is the training pipeline: evaluating would restart the stream being "
                              "trained on. Build a separate pipeline for evaluation (held-out data, "
                              "stop_after_passes=1)")
        if pipeline.session.resume is not None:
            raise ConfigError(f"{where} has a loaded state, but every evaluation reads its pipeline from the "
                              "beginning: evaluate on a pipeline without load_state_dict()")
        replicas = pipeline.description.settings["canonical_replicas"]
        if any(pipeline.spec.num_windows(lane) is None for lane in range(replicas)):
            raise ConfigError(f"the {where} pipeline never ends (exhausted_policy='repeat'), so an evaluation "
                              "would not either: evaluate a finite stream, e.g. MixtureWorkSource(..., "
                              "stop_after_passes=1)")
        if compute_metrics is not None:
            raise ConfigError(f"compute_metrics needs every prediction gathered, which a pipeline evaluation "
                              f"does not do ({where}); it reports eval_loss (the mean loss per label token). "
                              "Drop compute_metrics, or evaluate that metric on a datasets.Dataset")

    # -- training ---------------------------------------------------------------------------

    def _match_step(self, given: int | None = None) -> None:
        """One optimizer step = one global step of the pipeline; the batch size is its microbatch.
        ``given``: the user's ``gradient_accumulation_steps``, refused if it says otherwise."""
        shape = self.pipeline.session.step_shape()
        if given is not None and given not in (1, shape.per_rank):
            raise ConfigError(
                f"gradient_accumulation_steps={given}, but one optimizer step must be one global step of the "
                f"pipeline: {shape.per_rank} batches per rank at dp_degree={shape.dp_degree} "
                f"(pipeline.session.step_shape().per_rank). {type(self).__name__} sets it: leave it unset, or change "
                "the step with .options(global_batches_per_step=...)"
            )
        if self.args.gradient_accumulation_steps != shape.per_rank:
            logger.info("gradient_accumulation_steps = %d: the pipeline's batches per rank per global step",
                        shape.per_rank)
        self.args.gradient_accumulation_steps = shape.per_rank
        self.args.per_device_train_batch_size = self.pipeline.description.batch.microbatch_size
        self._train_batch_size = self.pipeline.description.batch.microbatch_size  # what Trainer logs and counts

    def get_train_dataloader(self):
        """The pipeline's loader, unprepared (never re-sharded), yielding the model's fields."""
        loader = self.pipeline.to_torch_loader(num_workers=self.args.dataloader_num_workers,
                                               pin_memory=bool(self.args.dataloader_pin_memory
                                                               and torch.cuda.is_available()))
        extras = tuple(k for k in self.extra_fields if k not in self.model_fields)
        return ModelBatches(loader, self.model_fields + extras)

    def compute_loss(self, model, inputs, *args, **kwargs):
        """``Trainer.compute_loss`` on the model's fields; the extra per-token fields are taken off
        ``inputs`` first and kept in ``self.batch_extras``."""
        self.batch_extras = {k: inputs.pop(k) for k in list(inputs) if k not in self.model_fields}
        return super().compute_loss(model, inputs, *args, **kwargs)

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        """``Trainer.train``; a resume first restores the pipeline from the checkpoint, then sizes
        the step from the state (its global step is kept)."""
        checkpoint = resume_from_checkpoint
        if isinstance(checkpoint, bool):
            checkpoint = get_last_checkpoint(self.args.output_dir) if checkpoint else None
        if checkpoint is not None and Path(checkpoint).is_dir():
            self.pipeline.load_state_dict(checkpoint_state(checkpoint))
        self._match_step()
        stops = [c for c in self.callback_handler.callbacks if isinstance(c, StopOnPreemption)]
        for stop in stops:
            stop.trainer = self
        try:
            return super().train(resume_from_checkpoint, *args, **kwargs)
        finally:
            for stop in stops:
                stop.detach()

    def save_step_boundary(self, generators: dict | None = None) -> None:
        """Write ``checkpoint-N`` of the last completed optimizer step N in the middle of step N + 1
        (from a signal handler, never during the optimizer step): the weights, optimizer and
        scheduler are still step N's; the random generators saved are ``generators`` (as step
        N + 1 began; ``None``: now) and the pipeline state is the one at the end of step N.

        Args:
            generators: a state from :func:`zephon_dask.integrations.rng.capture`.
        """
        now = rng.capture()
        if generators is not None:
            rng.restore(generators)  # the Trainer writes the generators' current state
        try:
            self._save_checkpoint(self.model, trial=None)
        finally:
            rng.restore(now)
        folder = Path(self.args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        save_state(folder / STATE_FILE, self.pipeline.state_dict(at_step=self.state.global_step))

    # -- evaluation -------------------------------------------------------------------------

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
        """``Trainer.evaluate``; an evaluation pipeline is read from its beginning (see
        :meth:`evaluate_pipeline`), other datasets go to the base class."""
        chosen = self.eval_dataset if eval_dataset is None else eval_dataset
        if isinstance(chosen, str) and isinstance(self.eval_dataset, dict):
            chosen = self.eval_dataset[chosen]
        if isinstance(chosen, dict) and any(is_pipeline(d) for d in chosen.values()):
            metrics: dict = {}
            for name, d in chosen.items():  # by name, as the base class does, unless given as objects
                metrics.update(self.evaluate(name if eval_dataset is None else d, ignore_keys,
                                             f"{metric_key_prefix}_{name}"))
            return metrics
        if not is_pipeline(chosen):
            return super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)
        pipeline = pipeline_of(chosen, "eval_dataset")
        self._check_eval(pipeline, f"the evaluation {metric_key_prefix!r}", self.compute_metrics)
        return self.evaluate_pipeline(pipeline, ignore_keys, metric_key_prefix)

    def evaluate_pipeline(self, pipeline, ignore_keys=None, metric_key_prefix="eval") -> dict:
        """Evaluate on ``pipeline`` from its beginning: ``{prefix}_loss`` and speed metrics, logged and
        passed to the callbacks as ``Trainer.evaluate`` does.

        Each rank reads its own lanes, in step with the others (a rank whose lanes
        ended runs a batch with no label token until all have ended, so per-batch
        collectives in ``compute_loss`` match). ``{prefix}_loss`` is the sum over
        every rank's batches of (the batch's loss x its label tokens), divided by
        all label tokens: the loss per token of the whole stream, the same at any
        dp degree (``average_tokens_across_devices`` is off meanwhile, so a batch's
        loss is its own mean). The batches come through the pipeline's own
        iterator (no ``DataLoader``), so no random number generator is drawn from.
        """
        start = time.time()
        averaged = self.args.average_tokens_across_devices
        self.args.average_tokens_across_devices = False  # each batch's loss per its own tokens; ranks summed here
        try:
            loss, samples, steps = self._pipeline_loss(pipeline, ignore_keys)
        finally:
            self.args.average_tokens_across_devices = averaged
        metrics = {f"{metric_key_prefix}_loss": loss}
        metrics.update(speed_metrics(metric_key_prefix, start, num_samples=samples, num_steps=steps))
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    def _pipeline_loss(self, pipeline, ignore_keys) -> tuple[float, int, int]:
        """(loss per label token over all ranks, samples over all ranks, steps taken in step)."""
        model, device, dist = self.model, self.args.device, torch_dist.initialized(several=True)
        if dist is not None and pipeline.session.identity()[0] != dist.get_world_size():
            raise ConfigError(f"the evaluation pipeline has dp_degree={pipeline.session.identity()[0]} in a job of "
                              f"{dist.get_world_size()} ranks: each rank must evaluate its own lanes (leave "
                              "dp_degree unset)")
        model.eval()
        if callable(getattr(self.optimizer, "eval", None)):
            self.optimizer.eval()
        totals = torch.zeros(3, dtype=torch.float64)  # sum of loss x label tokens, label tokens, samples
        first = None
        steps = 0
        pipeline.session.serve_evaluation()  # every sample: an evaluation steps no optimizer
        batches = pipeline.to_torch(device=device)
        while True:
            batch = next(batches, None)
            if not torch_dist.any_rank(batch is not None):  # every rank's lanes ended
                break
            if batch is not None:
                inputs = {k: batch[k] for k in self.model_fields}
                first = inputs if first is None else first
                targets = int((inputs["labels"][..., 1:] != IGNORE_INDEX).sum())  # the model shifts them
            else:
                inputs, targets = _blank(self.model_fields, first, device), 0
            loss, _, _ = self.prediction_step(model, inputs, prediction_loss_only=True, ignore_keys=ignore_keys)
            if loss is None:
                raise ConfigError(f"the model returned no loss for an evaluation batch with the fields "
                                  f"{sorted(inputs)}: it needs labels (label_names={self.label_names})")
            if batch is not None:  # a batch without label tokens adds its samples, not its (undefined) loss
                totals += torch.tensor([float(loss) * targets if targets else 0.0, targets,
                                        inputs["input_ids"].shape[0]], dtype=torch.float64)
            self.control = self.callback_handler.on_prediction_step(self.args, self.state, self.control)
            steps += 1
        if dist is not None:
            summed = totals.to(device)
            dist.all_reduce(summed)
            totals = summed.cpu()
        loss_sum, tokens, samples = totals.tolist()
        if not tokens:
            raise ConfigError(f"the evaluation pipeline gave {int(samples)} samples and no label token: nothing "
                              "to evaluate. Its lanes may each hold less than one batch, which drop_last drops: "
                              ".batch(n, labels='hf', drop_last=False), or more data")
        return loss_sum / tokens, int(samples), steps


class ZephonTrainer(ZephonTrainerMixin, Trainer):
    """``transformers.Trainer`` whose training (and evaluation) data are zephon_dask pipelines;
    see :class:`ZephonTrainerMixin`.

    Example:
        >>> trainer = ZephonTrainer(model=model, args=TrainingArguments("out", max_steps=1000),  # doctest: +SKIP
        ...                         train_dataset=pipeline)
        >>> trainer.train(resume_from_checkpoint=True)  # doctest: +SKIP
    """
