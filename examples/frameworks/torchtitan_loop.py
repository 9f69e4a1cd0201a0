"""Train a tiny causal LM on a zephon_dask pipeline with TorchTitan's data loader contract and checkpointer.

    python examples/frameworks/torchtitan_loop.py --steps 12 --out runs/tt
    torchrun --nproc-per-node 2 examples/frameworks/torchtitan_loop.py --steps 12 --out runs/tt-dp2
    torchrun --nproc-per-node 4 examples/frameworks/torchtitan_loop.py --steps 24 --out runs/tt-dp4 \\
        --resume runs/tt-dp2/checkpoint/step-12

The loop does what TorchTitan's ``Trainer.train()`` does around the data (the
trainer itself needs CUDA): the loader is built from its config as the trainer
builds it, each optimizer step draws ``global_batch_size / (local_batch_size x dp)``
micro-batches, and TorchTitan's ``CheckpointManager`` saves the model, the
optimizer, the step and the loader with ``torch.distributed.checkpoint``. The
checkpoint of a dp=2 run resumes at dp=1 or dp=4 with the same global steps.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
from torchtitan.components.checkpoint import CheckpointManager
from torchtitan.components.optimizer import LRSchedulersContainer, default_adamw
from torchtitan.config import ParallelismConfig, TrainingConfig

import zephon_dask as z
from zephon_dask.integrations.torchtitan import configure

RECIPE = Path(__file__).resolve().parents[1] / "recipe.toml"  # examples/recipe.toml: rows of 512 tokens


class TinyLM(torch.nn.Module):
    """A two-layer causal transformer over the bytes tokenizer's 258 ids."""

    def __init__(self, vocab: int = 258, dim: int = 32, max_len: int = 512):
        super().__init__()
        self.embed, self.position = torch.nn.Embedding(vocab, dim), torch.nn.Embedding(max_len, dim)
        layer = torch.nn.TransformerEncoderLayer(dim, 2, 2 * dim, dropout=0.0, batch_first=True)
        self.blocks = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, tokens, positions):
        mask = torch.nn.Transformer.generate_square_subsequent_mask(tokens.shape[1])
        return self.head(self.blocks(self.embed(tokens) + self.position(positions), mask=mask, is_causal=True))


class TrainState:
    """The step, saved as ``train_state`` like TorchTitan's trainer saves its own."""

    def __init__(self):
        self.step = 0

    def state_dict(self):
        return {"step": self.step}

    def load_state_dict(self, state):
        self.step = state["step"]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--save-every", type=int, default=6)
    ap.add_argument("--out", default="runs/tt")
    ap.add_argument("--resume", help="a step-N folder of another run's checkpoint/ (any DP degree)")
    ap.add_argument("--runner", default="distributed", help="threads or synchronous skip the Dask cluster")
    a = ap.parse_args(argv)

    if "RANK" in os.environ:  # under torchrun
        dist.init_process_group("gloo")
    world, rank = (dist.get_world_size(), dist.get_rank()) if dist.is_initialized() else (1, 0)
    pipeline = (z.Pipeline.from_config(RECIPE)
                .batch(4, labels=True, mask_document_boundaries=True)  # next-token targets, as TorchTitan's loss
                .options(runner=a.runner))
    # what a config_registry function does for TorchTitan's Trainer: loader, local and global batch sizes
    config = configure(SimpleNamespace(training=TrainingConfig(seq_len=512, steps=a.steps),
                                       parallelism=ParallelismConfig(), dataloader=None), pipeline)
    training = config.training
    accumulation = training.global_batch_size // (training.local_batch_size * world)  # the trainer's formula
    with pipeline:
        loader = config.dataloader.build(dp_world_size=world, dp_rank=rank, seq_len=training.seq_len,
                                         local_batch_size=training.local_batch_size)
        torch.manual_seed(0)
        model = TinyLM()
        trained = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
        optimizers = default_adamw(lr=1e-3, implementation="for-loop").build(model_parts=[model])
        schedulers = LRSchedulersContainer.Config(warmup_steps=2).build(optimizers=optimizers,
                                                                        training_steps=a.steps)
        state = TrainState()
        checkpointer = CheckpointManager.Config(
            enable=True, interval=a.save_every, keep_latest_k=0, last_save_model_only=False,
            initial_load_path=str(Path(a.resume).resolve()) if a.resume else None,
            initial_load_model_only=not a.resume,
        ).build(dataloader=loader, model_parts=[model], optimizers=optimizers, lr_schedulers=schedulers,
                states={"train_state": state}, sd_adapter=None, base_folder=a.out)
        checkpointer.load()  # its own latest step-N under --out, else --resume: weights, step, data position
        batches = iter(loader)
        while state.step < a.steps:
            state.step += 1
            optimizers.zero_grad()
            for _ in range(accumulation):
                inputs, labels = next(batches)  # ({"input", "positions"}, labels), [4, 512] each
                logits = trained(inputs["input"], inputs["positions"])
                loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(),
                                                         ignore_index=-100)
                (loss / accumulation).backward()
            optimizers.step()
            schedulers.step()
            if rank == 0:
                print(f"step {state.step}: loss {loss.item():.3f}", flush=True)
            checkpointer.save(state.step, last_step=state.step == a.steps)
        checkpointer.close()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
