"""Train a tiny Llama with accelerate on a zephon_dask pipeline, in your own loop.

    python examples/frameworks/accelerate_loop.py --steps 12 --out runs/acc
    python examples/frameworks/accelerate_loop.py --steps 12 --out runs/acc2 --resume runs/acc/step-6
    accelerate launch --num-processes 2 examples/frameworks/accelerate_loop.py --steps 12 --out runs/acc-ddp

``prepare_pipeline`` gives a loader on the accelerator's device that accelerate
never splits again; ``save_state``/``load_state`` carry its position.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from accelerate import Accelerator
from transformers import LlamaConfig, LlamaForCausalLM

import zephon_dask as z
from zephon_dask.integrations.accelerate import prepare_pipeline

RECIPE = Path(__file__).resolve().parents[1] / "recipe.toml"  # examples/recipe.toml
MODEL_FIELDS = ("input_ids", "labels", "attention_mask", "position_ids")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--save-every", type=int, default=6)
    ap.add_argument("--out", default="runs/acc")
    ap.add_argument("--resume", help="a step-N folder written by save_state")
    ap.add_argument("--runner", default="distributed", help="threads or synchronous skip the Dask cluster")
    a = ap.parse_args(argv)

    accelerator = Accelerator()  # under a launcher, torch.distributed is initialised here
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=258, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=512, bos_token_id=256, eos_token_id=257, pad_token_id=0))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    pipeline = (z.Pipeline.from_config(RECIPE)
                .batch(4, labels="hf", mask_document_boundaries=True)
                .options(runner=a.runner))
    with pipeline:
        loader = prepare_pipeline(accelerator, pipeline)  # on the device, never re-sharded, checkpointed
        first = 0
        if a.resume:
            accelerator.load_state(a.resume)  # model, optimizer, RNG and the pipeline's position
            first = int(Path(a.resume).name.split("-")[-1])
        per_step = pipeline.session.step_shape().per_rank  # batches per rank in one global step
        batches = iter(loader)
        for step in range(first, a.steps):
            for _ in range(per_step):
                batch = next(batches)
                loss = model(**{k: batch[k] for k in MODEL_FIELDS}).loss / per_step
                accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            accelerator.print(f"step {step + 1}: loss {loss.item() * per_step:.3f}")
            if (step + 1) % a.save_every == 0:
                accelerator.save_state(str(Path(a.out) / f"step-{step + 1}"))


if __name__ == "__main__":
    main()
