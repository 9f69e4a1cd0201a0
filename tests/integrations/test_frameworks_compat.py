"""One test per framework name of ``zephon_dask/pipeline/frameworks_compat.py`` (each name's comment
names its test): a framework release that renames or moves one fails here, by name, instead of a
refusal silently no longer happening. Each runs the framework's own code over a probe dataset that
records the call stack it is iterated from."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from zephon_dask.pipeline import frameworks_compat as compat
from zephon_dask.pipeline import guard


class Probe(IterableDataset):
    """Yields ``n`` tensors; records, at each ``iter()``, the (module, qualname) of every caller and
    what the guard sees."""

    def __init__(self, n: int = 4):
        self.n = n
        self.stacks: list[list[tuple[str, str]]] = []
        self.wrappers: list[str | None] = []
        self.loops: list[str | None] = []

    def __iter__(self):
        self.stacks.append([(f.frame.f_globals.get("__name__", ""), f.frame.f_code.co_qualname)
                            for f in inspect.stack()[1:]])
        self.wrappers.append(guard.resharding_wrapper())
        self.loops.append(_loop())
        return iter([torch.tensor([float(i)]) for i in range(self.n)])


def _loop() -> str | None:
    return guard.fetching_training_loop()  # looks above the caller of this function's caller


def _on_stack(stack, names) -> bool:
    return any(module.startswith(n.module) and qualname.startswith(n.owner)
               for module, qualname in stack for n in names)


# -- accelerate and transformers ---------------------------------------------------------------


def test_accelerate_iterable_dataset_shard():
    data_loader = pytest.importorskip("accelerate.data_loader")
    probe = Probe()
    list(data_loader.IterableDatasetShard(probe, batch_size=1, num_processes=2, process_index=0))
    assert _on_stack(probe.stacks[0], [compat.ACCELERATE_ITERABLE_SHARD])
    assert probe.wrappers == ["accelerate.data_loader.IterableDatasetShard"]


def test_accelerate_data_loader_dispatcher():
    data_loader = pytest.importorskip("accelerate.data_loader")
    probe = Probe()
    list(data_loader.DataLoaderDispatcher(probe, batch_size=None))
    assert _on_stack(probe.stacks[0], [compat.ACCELERATE_DISPATCHER])
    assert probe.wrappers == ["accelerate.data_loader.DataLoaderDispatcher"]


def test_accelerate_data_loader_shard():
    data_loader = pytest.importorskip("accelerate.data_loader")
    probe = Probe()
    list(data_loader.DataLoaderShard(probe, batch_size=None))
    assert _on_stack(probe.stacks[0], [compat.ACCELERATE_SHARD])
    assert probe.wrappers == ["accelerate.data_loader.DataLoaderShard"]


def test_transformers_iterable_dataset_shard():
    trainer_pt_utils = pytest.importorskip("transformers.trainer_pt_utils")
    probe = Probe()
    list(trainer_pt_utils.IterableDatasetShard(probe, batch_size=1, num_processes=2, process_index=0))
    assert _on_stack(probe.stacks[0], [compat.TRANSFORMERS_ITERABLE_SHARD])
    assert probe.wrappers == ["transformers.trainer_pt_utils.IterableDatasetShard"]


def test_a_plain_dataloader_is_no_wrapper():
    probe = Probe()
    list(DataLoader(probe, batch_size=None))
    assert probe.wrappers == [None] and probe.loops == [None]


# -- Lightning ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fitted():
    """Five steps over epochs of two batches (three epochs), a validation run after every step;
    the probes saw the stacks of every iter()."""
    pl = pytest.importorskip("pytorch_lightning")

    class Model(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch).sum()

        def validation_step(self, batch, batch_idx):
            return None

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    train, val = Probe(2), Probe(2)
    trainer = pl.Trainer(max_steps=5, val_check_interval=1, limit_val_batches=1, num_sanity_val_steps=0,
                         accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice on workers and logging
        trainer.fit(Model(), DataLoader(train, batch_size=None), DataLoader(val, batch_size=None))
    return trainer, train, val


def test_lightning_fit_loop(fitted):
    """The first epoch's iter() comes from the fit loop's set-up."""
    _, train, _ = fitted
    assert _on_stack(train.stacks[0], compat.FIT_LOOP) and not _on_stack(train.stacks[0], compat.TRAINING_EPOCH_LOOP)
    assert train.loops[0] is not None and train.loops[0].endswith("._FitLoop")


def test_lightning_training_epoch_loop(fitted):
    """Every later epoch's iter() comes from the epoch loop's start."""
    _, train, _ = fitted
    assert len(train.stacks) == 3
    assert all(_on_stack(stack, compat.TRAINING_EPOCH_LOOP) for stack in train.stacks[1:])
    assert all(loop is not None and loop.endswith("._TrainingEpochLoop") for loop in train.loops[1:])


def test_lightning_evaluation_loop(fitted):
    """Validation inside fit: the evaluation loop is met first, so it is not a training loop."""
    _, _, val = fitted
    assert val.stacks, "the validation loader was never iterated"
    assert all(_on_stack(stack, compat.EVALUATION_LOOP) and _on_stack(stack, compat.TRAINING_EPOCH_LOOP)
               for stack in val.stacks)
    assert set(val.loops) == {None}


def test_lightning_fit_loop_restarting(fitted):
    trainer, _, _ = fitted
    assert compat.fit_restarting(trainer) is False


def test_lightning_progress_counters(fitted):
    """The epoch's micro-batch count becomes its optimizer steps times the accumulation; every
    tracker, current and total, moves by the same shift."""
    trainer, _, _ = fitted
    loop = trainer.fit_loop.epoch_loop
    steps = loop.automatic_optimization.optim_progress.optimizer.step.current.completed
    counts = loop.batch_progress
    before = [(t.ready, t.started, t.processed, t.completed) for t in (counts.current, counts.total)]
    assert steps == before[0][2] == 1  # this epoch (the third) trained one batch, one optimizer step
    trainer.accumulate_grad_batches = 2
    compat.restart_accumulation(trainer)
    shift = before[0][2] - steps * 2
    assert [(t.ready, t.started, t.processed, t.completed) for t in (counts.current, counts.total)] == [
        tuple(v - shift for v in values) for values in before]
    assert counts.current.processed == steps * 2
