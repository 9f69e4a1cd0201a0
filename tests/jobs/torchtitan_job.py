"""TorchTitan's training around the data under ``torchrun`` (gloo, CPU), for
tests/integrations/test_integrations_torchtitan.py.

TorchTitan's ``Trainer`` cannot start on a CPU-only torch (see docs/frameworks.md,
TorchTitan: it sets a CUDA device in ``Trainer.__init__``), so this job does
what ``torchtitan.train`` does around the data with TorchTitan's own parts and
nothing of TorchTitan's changed: the config comes from a config function through
TorchTitan's ``ConfigManager`` (``--module tests.jobs.torchtitan_job --config
titan_config`` and command-line overrides, as ``torchtitan.train`` parses it);
the tokenizer, data loader, optimizer, LR schedule and ``CheckpointManager`` are
built from that config with the arguments ``Trainer.__init__`` passes; the step
loop is ``Trainer.train``'s: load the latest checkpoint, draw the trainer's
gradient-accumulation count of micro-batches per step, save after the step.
Each rank writes, per step, the digests of the ``(input, labels, positions)``
micro-batches it trained on to ``<dump_folder>/rank-<r>.json``.

The pipeline reads the corpus named by ``$ZEPHON_TITAN_CORPUS``.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: tests.helpers

from torchtitan.components.checkpoint import CheckpointManager  # noqa: E402
from torchtitan.components.checkpointer.base import BaseCheckpointManager  # noqa: E402
from torchtitan.components.dataloader import BaseDataLoader  # noqa: E402
from torchtitan.components.optimizer import (  # noqa: E402
    LRSchedulersContainer,
    OptimizersContainer,
    default_adamw,
)
from torchtitan.components.tokenizer import BaseTokenizer, HuggingFaceTokenizer  # noqa: E402
from torchtitan.config import ParallelismConfig, TrainingConfig  # noqa: E402
from torchtitan.config.manager import ConfigManager  # noqa: E402

from tests.helpers.frameworks import VOCAB, digest  # noqa: E402
from tests.helpers.pipelines import build  # noqa: E402
from zephon_dask.integrations.torchtitan import configure  # noqa: E402

SEQ_LEN = 128  # TorchTitan's training.seq_len; the pipeline packs rows of 96
CORPUS_ENV = "ZEPHON_TITAN_CORPUS"


def titan_pipeline(corpus_dir, labels=True):
    """Four lanes (DP degrees 1, 2, 4), micro-batches of two rows of at most 96 tokens, shifted labels."""
    return build(corpus_dir, R=4, k=1, microbatch=None, runner="synchronous").batch(
        2, labels=labels, mask_document_boundaries=True)


def write_tokenizer(folder: Path) -> Path:
    """A tiny local ``tokenizer.json`` for TorchTitan's ``HuggingFaceTokenizer`` (the trainer
    always builds one from ``hf_assets_path``; the pipeline tokenizes on its own)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"t{i}": i for i in range(16)} | {"[UNK]": 16}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder


@dataclass(kw_only=True, slots=True)
class JobConfig:
    """The fields of ``Trainer.Config`` that the trainer reads around the data, declared as it
    declares them (TorchTitan's command line narrows each to its default's class)."""

    hf_assets_path: str = "./tests/assets/tokenizer"
    dump_folder: str = "./outputs"
    tokenizer: BaseTokenizer.Config = field(default_factory=HuggingFaceTokenizer.Config)
    dataloader: BaseDataLoader.Config = field(default_factory=BaseDataLoader.Config)
    optimizer: OptimizersContainer.Config = field(default_factory=OptimizersContainer.Config)
    lr_scheduler: LRSchedulersContainer.Config = field(default_factory=LRSchedulersContainer.Config)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    checkpoint: BaseCheckpointManager.Config = field(default_factory=CheckpointManager.Config)


def titan_config() -> JobConfig:
    """A config function as in a ``config_registry``: the pipeline set in Python by ``configure``."""
    config = JobConfig(optimizer=default_adamw(lr=1e-2, implementation="for-loop"),
                       lr_scheduler=LRSchedulersContainer.Config(warmup_steps=1),
                       training=TrainingConfig(seq_len=SEQ_LEN, steps=6),
                       checkpoint=CheckpointManager.Config(enable=True, interval=3, keep_latest_k=0,
                                                           last_save_model_only=False))
    return configure(config, titan_pipeline(Path(os.environ[CORPUS_ENV])))


class TrainState:
    """The trainer's own ``Stateful`` (``train_state`` in the checkpoint)."""

    def __init__(self):
        self.step = 0
        self.ntokens_seen = 0

    def state_dict(self):
        return {"step": self.step, "ntokens_seen": self.ntokens_seen}

    def load_state_dict(self, state):
        self.step, self.ntokens_seen = state["step"], state["ntokens_seen"]


def tiny_lm() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(VOCAB, 16), torch.nn.Linear(16, VOCAB))


def main(argv: list[str] | None = None) -> int:
    """``torchtitan.train``'s arguments (``--module``, ``--config``, overrides); one process
    without ``torchrun`` is DP degree 1."""
    launched = "RANK" in os.environ
    if launched:
        dist.init_process_group("gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if launched else (0, 1)
    config = ConfigManager().parse_args(sys.argv[1:] if argv is None else argv)
    training = config.training
    accumulation = training.global_batch_size // (training.local_batch_size * world)  # Trainer.__init__'s
    tokenizer = config.tokenizer.build(tokenizer_path=config.hf_assets_path)
    loader = config.dataloader.build(
        dp_world_size=world, dp_rank=rank, tokenizer=tokenizer, seq_len=training.seq_len,
        local_batch_size=training.local_batch_size,
        snapshot_every_n_steps=config.checkpoint.interval * accumulation)
    model = tiny_lm()
    optimizers = config.optimizer.build(model_parts=[model])
    schedulers = config.lr_scheduler.build(optimizers=optimizers, training_steps=training.steps)
    state = TrainState()
    checkpointer = config.checkpoint.build(
        dataloader=loader, model_parts=[model], optimizers=optimizers, lr_schedulers=schedulers,
        states={"train_state": state}, sd_adapter=None, base_folder=config.dump_folder)
    checkpointer.load(step=config.checkpoint.load_step)  # Trainer.train: the latest step-N, if any
    trained: dict[int, list[str]] = {}
    batches = iter(loader)
    while state.step < training.steps:
        state.step += 1
        optimizers.zero_grad()
        for _ in range(accumulation):
            inputs, labels = next(batches)
            trained.setdefault(state.step, []).append(digest(inputs["input"]) + digest(labels)
                                                      + digest(inputs["positions"]))
            state.ntokens_seen += labels.numel()
            logits = model(inputs["input"])
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
            (loss / accumulation).backward()
        if launched:  # data parallel: the gradient averaged over the ranks
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world
        optimizers.step()
        schedulers.step()
        checkpointer.save(state.step, last_step=state.step == training.steps)
    checkpointer.close()
    loader.close()
    config.dataloader.pipeline.close()
    Path(config.dump_folder).mkdir(parents=True, exist_ok=True)
    (Path(config.dump_folder) / f"rank-{rank}.json").write_text(json.dumps({"world": world, "steps": trained}))
    if launched:
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
