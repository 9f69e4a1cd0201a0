"""A TorchTitan training run under ``torchrun`` (gloo, CPU), for tests/integrations/test_integrations_torchtitan.py.

TorchTitan's ``Trainer`` needs CUDA (and triton) to start, so this loop does what
its ``train()`` does around the data, with TorchTitan's own parts: the
``ZephonDataLoader`` is built from its config the way the trainer builds a data
loader, the batch sizes come from ``configure`` on TorchTitan's ``TrainingConfig``,
the gradient accumulation is the trainer's formula, and TorchTitan's
``CheckpointManager`` (DCP) saves and loads the model, the optimizer, the LR
schedule, the step and the data loader. ``--resume`` loads a checkpoint of
another run (``initial_load_path``, full state) at whatever DP degree this
launch has. Each rank writes, per optimizer step, the digests of the
``(input, labels)`` micro-batches it trained on to ``--out/rank-<r>.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: tests.helpers

from torchtitan.components.checkpoint import CheckpointManager  # noqa: E402
from torchtitan.components.optimizer import LRSchedulersContainer, default_adamw  # noqa: E402
from torchtitan.config import ParallelismConfig, TrainingConfig  # noqa: E402

from tests.helpers.frameworks import VOCAB, digest  # noqa: E402
from tests.helpers.pipelines import build  # noqa: E402
from zephon_dask.integrations.torchtitan import configure  # noqa: E402

SEQ_LEN = 128  # TorchTitan's training.seq_len; the pipeline packs rows of 96


def titan_pipeline(corpus_dir, labels=True):
    """Four lanes (DP degrees 1, 2, 4), micro-batches of two rows of at most 96 tokens, shifted labels."""
    return build(corpus_dir, R=4, k=1, microbatch=None, runner="synchronous").batch(
        2, labels=labels, mask_document_boundaries=True)


class TrainState:
    """The trainer's own ``Stateful`` (``train_state`` in the checkpoint)."""

    def __init__(self):
        self.step = 0

    def state_dict(self):
        return {"step": self.step}

    def load_state_dict(self, state):
        self.step = state["step"]


def tiny_lm() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(VOCAB, 16), torch.nn.Linear(16, VOCAB))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--interval", type=int, default=3)
    ap.add_argument("--resume", help="a step-N checkpoint folder of another run")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    pipeline = titan_pipeline(Path(args.corpus))
    config = configure(SimpleNamespace(training=TrainingConfig(seq_len=SEQ_LEN, steps=args.steps),
                                       parallelism=ParallelismConfig(), dataloader=None), pipeline)
    training = config.training
    accumulation = training.global_batch_size // (training.local_batch_size * world)  # the trainer's formula
    loader = config.dataloader.build(dp_world_size=world, dp_rank=rank, tokenizer=None, seq_len=training.seq_len,
                                     local_batch_size=training.local_batch_size, snapshot_every_n_steps=None)
    model = tiny_lm()
    optimizers = default_adamw(lr=1e-2, implementation="for-loop").build(model_parts=[model])
    schedulers = LRSchedulersContainer.Config(warmup_steps=1).build(optimizers=optimizers,
                                                                    training_steps=args.steps)
    state = TrainState()
    checkpoint = CheckpointManager.Config(
        enable=True, interval=args.interval, keep_latest_k=0, last_save_model_only=False,
        initial_load_path=str(Path(args.resume).resolve()) if args.resume else None,
        initial_load_model_only=not args.resume,
    ).build(dataloader=loader, model_parts=[model], optimizers=optimizers, lr_schedulers=schedulers,
            states={"train_state": state}, sd_adapter=None, base_folder=args.out)
    checkpoint.load()
    trained: dict[int, list[str]] = {}
    batches = iter(loader)
    while state.step < args.steps:
        state.step += 1
        optimizers.zero_grad()
        for _ in range(accumulation):
            inputs, labels = next(batches)
            trained.setdefault(state.step, []).append(digest(inputs["input"]) + digest(labels)
                                                      + digest(inputs["positions"]))
            logits = model(inputs["input"])
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
            (loss / accumulation).backward()
        for p in model.parameters():  # data parallel: the gradient averaged over the ranks
            dist.all_reduce(p.grad)
            p.grad /= world
        optimizers.step()
        schedulers.step()
        checkpoint.save(state.step, last_step=state.step == args.steps)
    checkpoint.close()
    loader.close()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / f"rank-{rank}.json").write_text(json.dumps({"world": world, "steps": trained}))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
