"""Framework training runs under ``torchrun`` (gloo, CPU), for tests/integrations/test_integrations_*.py.

Each rank trains a tiny model through each framework's zephon_dask integration
and writes the digests of the ``input_ids`` its model received to
``--out/rank-<r>.json``: per framework, ``inputs`` and, where the job also
resumes from the step-6 checkpoint in the same ranks, ``resumed``; for Hugging
Face also what its evaluations read (``evaluated``), the final ``eval_loss``
and this rank's share of its oracle (``by_hand``, ``own_batches``); for TRL
the same after an evaluation whose ranks hold unequal numbers of batches.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: tests.helpers

from tests.helpers.frameworks import (  # noqa: E402
    SAVE_AT,
    STEPS,
    end_process_group_after,
    hand_eval,
    hf_eval_pipeline,
    hf_pipeline,
    record_eval_inputs,
    record_inputs,
    tiny_gpt2,
)


def run_hf(args) -> dict:
    """Training with an evaluation every 3 steps, then one more evaluation and its oracle on this rank."""
    from transformers import TrainingArguments

    from zephon_dask.integrations.hf import ZephonTrainer

    model = tiny_gpt2()
    seen, evaluated = record_inputs(model), record_eval_inputs(model)
    # a global step is 2 batches per rank at dp=2: STEPS batches per rank in STEPS // 2 steps
    targs = TrainingArguments(output_dir=str(Path(args.out) / "hf"), max_steps=STEPS // 2, save_strategy="steps",
                              save_steps=SAVE_AT // 2, eval_strategy="steps", eval_steps=SAVE_AT // 2, report_to=[],
                              logging_strategy="no", disable_tqdm=True, use_cpu=True, seed=0, ddp_backend="gloo")
    with (hf_pipeline(Path(args.corpus), runner="threads") as pipe,
          hf_eval_pipeline(Path(args.eval_corpus), runner="threads") as held_out):
        trainer = ZephonTrainer(model=model, args=targs, train_dataset=pipe, eval_dataset=held_out)
        trainer.train()
        metrics = trainer.evaluate()
        evaluated = list(evaluated)
        total, count, own = hand_eval(model, held_out)
    return {"inputs": seen, "evaluated": evaluated, "eval_loss": metrics["eval_loss"],
            "eval_samples": round(metrics["eval_samples_per_second"] * metrics["eval_runtime"]),
            "by_hand": [total, count], "own_batches": own}


def run_trl(args) -> dict:
    """TRL's SFTTrainer on the TRL example's chat pipelines: 4 steps, then an evaluation whose two
    ranks hold unequal numbers of batches (TRL gathers its metrics across ranks at every batch)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl import SFTConfig

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "frameworks"))
    import trl_sft

    tokenizer = trl_sft.chat_tokenizer()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=256, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=None))
    config = SFTConfig(output_dir=str(Path(args.out) / "trl"), max_steps=4, save_strategy="no", report_to=[],
                       logging_strategy="no", disable_tqdm=True, bf16=False, gradient_checkpointing=False,
                       use_cpu=True, seed=0, ddp_backend="gloo")
    with (trl_sft.chat_pipeline(tokenizer, passes=500, runner="threads") as train,
          trl_sft.chat_pipeline(tokenizer, passes=1, runner="threads").options(canonical_replicas=4) as held_out):
        trainer = trl_sft.ZephonSFTTrainer(model=model, args=config, train_dataset=train, eval_dataset=held_out,
                                           processing_class=tokenizer)
        trainer.train()
        metrics = trainer.evaluate()
        total, count, own = hand_eval(model, held_out)
    return {"eval_loss": metrics["eval_loss"], "by_hand": [total, count], "own_batches": own}


def run_lightning(args) -> dict:
    """A full DDP fit of ``STEPS // 2`` global steps (two micro-batches per rank each: ``STEPS``
    batches), then a second fit in the same ranks resumed from its checkpoint after ``SAVE_AT`` batches."""
    from tests.helpers.frameworks import lightning_fit

    root = Path(args.out) / "lightning"
    kw = {"devices": 2, "strategy": "ddp", "use_distributed_sampler": True, "steps": STEPS // 2,
          "every": SAVE_AT // 2}
    with hf_pipeline(Path(args.corpus), runner="threads") as pipe:
        seen = lightning_fit(pipe, root / "full", **kw).seen
    with hf_pipeline(Path(args.corpus), runner="threads") as pipe:
        resumed = lightning_fit(pipe, root / "resumed",
                                resume=str(root / "full" / f"step={SAVE_AT // 2}.ckpt"), **kw).seen
    return {"inputs": seen, "resumed": resumed}


def run_accelerate(args) -> dict:
    from tests.helpers.frameworks import accelerate_run

    full, resumed = accelerate_run(lambda: hf_pipeline(Path(args.corpus), runner="threads"),
                                   Path(args.out) / "accelerate")
    return {"inputs": full, "resumed": resumed}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--frameworks", nargs="+", required=True, choices=["hf", "trl", "lightning", "accelerate"])
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--eval-corpus", help="a held-out corpus (Hugging Face evaluation)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    runs = {"hf": run_hf, "trl": run_trl, "lightning": run_lightning, "accelerate": run_accelerate}
    result = {name: runs[name](args) for name in args.frameworks}  # one launch: the imports are paid once
    rank = int(os.environ["RANK"])
    name = f"rank-{rank}.json"
    (Path(args.out) / name).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(end_process_group_after(main))
