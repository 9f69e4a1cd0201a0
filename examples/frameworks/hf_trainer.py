"""Train a tiny Llama with the Hugging Face Trainer on a zephon_dask pipeline, and evaluate it.

    python examples/frameworks/hf_trainer.py --steps 12 --out runs/hf
    python examples/frameworks/hf_trainer.py --steps 24 --out runs/hf --resume runs/hf/checkpoint-12
    torchrun --nproc-per-node 2 examples/frameworks/hf_trainer.py --steps 12 --out runs/hf-ddp

One optimizer step is one global step of the pipeline (ZephonTrainer sets the
gradient accumulation to the pipeline's batches per rank per step), each
checkpoint-N holds the pipeline's state, and a resume restores it instead of
re-reading N steps. Every --save-every steps the model is evaluated on a
finite evaluation pipeline, read from its beginning each time.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, TrainingArguments

import zephon_dask as z
from zephon_dask.integrations.hf import ZephonTrainer

EXAMPLES = Path(__file__).resolve().parents[1]
RECIPE = EXAMPLES / "recipe.toml"


def tiny_llama() -> LlamaForCausalLM:
    """Built from a config (no download); the bytes tokenizer has 258 ids (EOS = 257)."""
    config = LlamaConfig(vocab_size=258, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
                         bos_token_id=256, eos_token_id=257, pad_token_id=0)
    return LlamaForCausalLM(config)


def evaluation_pipeline() -> z.Pipeline:
    """One pass over the code snippets (in a real run: held-out data), in threads: it is small."""
    code = z.Dataset.from_jsonl("code", str(EXAMPLES / "data" / "code.jsonl"), progress=False)
    source = z.MixtureWorkSource([code], chunk_size=8, stop_after_passes=1)  # a finite stream
    return (z.Pipeline(source).tokenize("bytes").pack(512).batch(4, labels="hf", drop_last=False)  # every row
            .options(canonical_replicas=4, runner="threads"))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--save-every", type=int, default=6)
    ap.add_argument("--out", default="runs/hf")
    ap.add_argument("--resume", help="a checkpoint-N folder of an earlier run")
    ap.add_argument("--runner", default="distributed", help="threads or synchronous skip the Dask cluster")
    a = ap.parse_args(argv)

    args = TrainingArguments(output_dir=a.out, max_steps=a.steps, save_steps=a.save_every,
                             eval_strategy="steps", eval_steps=a.save_every, learning_rate=1e-3,
                             logging_steps=a.save_every, report_to=[])
    pipeline = (z.Pipeline.from_config(RECIPE)
                .batch(4, labels="hf", mask_document_boundaries=True)  # unshifted labels: the model shifts
                .options(runner=a.runner))
    with pipeline, evaluation_pipeline() as held_out:
        trainer = ZephonTrainer(model=tiny_llama(), args=args, train_dataset=pipeline, eval_dataset=held_out)
        trainer.train(resume_from_checkpoint=a.resume)


if __name__ == "__main__":
    try:
        main()
    finally:  # every rank ends its process group: gloo threads left at exit can abort the process
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
