"""Every name of a training framework's internals that the package relies on, in one module. Pure;
imports no framework.

:mod:`.guard` recognises a framework by the code on the call stack: a frame
whose module starts with ``module`` and whose qualified name starts with
``owner`` (a class, so any of its methods). Some of these classes are private
(Lightning's loops) or undocumented as a place on the stack (accelerate's
loaders): a release may rename or move them without notice. Each name below
says why it is matched and what breaks if the framework changes it, and
``tests/integrations/test_frameworks_compat.py`` has one test per name, named
in its comment, so a release that changes one fails that test instead of a
training run. ``pyproject.toml`` bounds each framework's extra below the first
minor release not tested.
"""

from __future__ import annotations

from typing import NamedTuple


class FrameName(NamedTuple):
    """Code on the stack: a frame of a module starting with ``module`` whose qualified name starts
    with ``owner``."""

    module: str
    owner: str


# -- wrappers that split an iterable stream by rank (refused: a pipeline already splits by rank) --

# accelerate's IterableDatasetShard (accelerate.data_loader): prepare() wraps an IterableDataset in
# it to keep every num_processes-th batch. Why: it would train each rank a fraction of its own lanes.
# If renamed or moved: no error, the split goes unrefused (test_accelerate_iterable_dataset_shard).
ACCELERATE_ITERABLE_SHARD = FrameName("accelerate.", "IterableDatasetShard.")
# accelerate's DataLoaderDispatcher (accelerate.data_loader): dispatch_batches=True iterates rank 0's
# loader and scatters its batches. Why: every rank would train rank 0's lanes. If renamed or moved:
# no error, the dispatch goes unrefused (test_accelerate_data_loader_dispatcher).
ACCELERATE_DISPATCHER = FrameName("accelerate.", "DataLoaderDispatcher.")
# accelerate's DataLoaderShard (accelerate.data_loader): what prepare() builds in one process. It does
# not split, but it rebuilds the loader, so the pipeline no longer sees what was delivered and its
# state would be wrong. If renamed or moved: no error, such a loader's state goes unrefused
# (test_accelerate_data_loader_shard).
ACCELERATE_SHARD = FrameName("accelerate.", "DataLoaderShard.")
# transformers' IterableDatasetShard (transformers.trainer_pt_utils): the Trainer's own copy of
# accelerate's shard. Why and what breaks: as for accelerate's (test_transformers_iterable_dataset_shard).
TRANSFORMERS_ITERABLE_SHARD = FrameName("transformers.", "IterableDatasetShard.")

RESHARDING_WRAPPERS = (ACCELERATE_ITERABLE_SHARD, ACCELERATE_DISPATCHER, ACCELERATE_SHARD,
                       TRANSFORMERS_ITERABLE_SHARD)

# -- Lightning's loops (pytorch_lightning, or lightning.pytorch in the unified package) -----------

LIGHTNING_LOOPS = ("pytorch_lightning.loops.", "lightning.pytorch.loops.")
# Lightning's _FitLoop (loops/fit_loop.py): the training loop; it fetches one batch ahead of the
# step and saves the loader's state_dict() in its checkpoints, so a pipeline iterated directly would
# skip a batch at every resume (refused: ZephonDataModule's loader saves the trained batches' state).
# If renamed or moved: no error, the skipped batch goes unrefused (test_lightning_fit_loop).
FIT_LOOP = tuple(FrameName(package, "_FitLoop.") for package in LIGHTNING_LOOPS)
# Lightning's _TrainingEpochLoop (loops/training_epoch_loop.py): the fit loop's epoch, where the
# batches are fetched. Why and what breaks: as for _FitLoop (test_lightning_training_epoch_loop).
TRAINING_EPOCH_LOOP = tuple(FrameName(package, "_TrainingEpochLoop.") for package in LIGHTNING_LOOPS)
# Lightning's _EvaluationLoop (loops/evaluation_loop.py): validation, run inside the fit loop; it
# saves no loader state, so it may iterate a pipeline. If renamed or moved: a pipeline validated
# during fit is refused as if trained on (test_lightning_evaluation_loop).
EVALUATION_LOOP = tuple(FrameName(package, "_EvaluationLoop.") for package in LIGHTNING_LOOPS)

TRAINING_LOOPS = (*FIT_LOOP, *TRAINING_EPOCH_LOOP)
EVALUATION_LOOPS = EVALUATION_LOOP


# -- Lightning's progress counters (read and moved by integrations.lightning on a resume) ---------


def fit_restarting(trainer) -> bool:
    """Whether Lightning's fit loop is restarting from a checkpoint (``trainer.fit_loop.restarting``).

    Why: on a resume the accumulation restarts at the last optimizer step
    (:func:`restart_accumulation`). If Lightning drops the flag: ``AttributeError`` at the first
    training batch (test_lightning_fit_loop_restarting)."""
    return bool(trainer.fit_loop.restarting)


def restart_accumulation(trainer) -> None:
    """On a resume, start Lightning's count of micro-batches at the last optimizer step (its
    epoch loop's ``batch_progress`` and the optimizer's completed steps, undocumented counters).

    The data resumes after the batches the weights trained on, and gradients are
    not checkpointed, so the next optimizer step accumulates a whole step from
    there: the epoch's count becomes its optimizer steps times the accumulation
    (also after a change of DP degree). All progress counters move together, so
    Lightning's restart bookkeeping (which compares them) is unchanged.

    If Lightning renames a counter: ``AttributeError`` at a resume's first batch; if it stops
    reading them: no error, the first optimizer step after a resume accumulates the wrong count
    of micro-batches (test_lightning_progress_counters).
    """
    loop = trainer.fit_loop.epoch_loop
    steps = loop.automatic_optimization.optim_progress.optimizer.step.current.completed
    counts = loop.batch_progress
    shift = counts.current.processed - steps * trainer.accumulate_grad_batches
    for tracker in (counts.current, counts.total):
        tracker.ready -= shift
        tracker.started -= shift
        tracker.processed -= shift
        tracker.completed -= shift

