"""Framework training runs under ``torchrun`` (gloo, CPU), for tests/test_integrations_*.py.

Each rank trains a tiny model through each framework's zephon_dask integration
and writes the digests of the ``input_ids`` its model received to
``--out/rank-<r>.json``: per framework, ``inputs`` and, where the job also
resumes from the step-6 checkpoint in the same ranks, ``resumed``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from frameworks import SAVE_AT, STEPS, hf_pipeline, record_inputs, tiny_gpt2  # noqa: E402


def run_hf(args) -> dict:
    from transformers import TrainingArguments

    from zephon_dask.integrations.hf import ZephonTrainer

    model = tiny_gpt2()
    seen = record_inputs(model)
    targs = TrainingArguments(output_dir=str(Path(args.out) / "hf"), max_steps=STEPS, save_strategy="steps",
                              save_steps=SAVE_AT, report_to=[], logging_strategy="no", disable_tqdm=True,
                              use_cpu=True, seed=0, ddp_backend="gloo")
    with hf_pipeline(Path(args.corpus), runner="threads") as pipe:
        ZephonTrainer(model=model, args=targs, train_dataset=pipe).train()
    return {"inputs": seen}


def run_lightning(args) -> dict:
    """A full DDP fit of ``STEPS // 2`` global steps (two micro-batches per rank each: ``STEPS``
    batches), then a second fit in the same ranks resumed from its checkpoint after ``SAVE_AT`` batches."""
    from frameworks import lightning_fit

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
    from frameworks import accelerate_run

    full, resumed = accelerate_run(lambda: hf_pipeline(Path(args.corpus), runner="threads"),
                                   Path(args.out) / "accelerate")
    return {"inputs": full, "resumed": resumed}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--frameworks", nargs="+", required=True, choices=["hf", "lightning", "accelerate"])
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    runs = {"hf": run_hf, "lightning": run_lightning, "accelerate": run_accelerate}
    result = {name: runs[name](args) for name in args.frameworks}  # one launch: the imports are paid once
    rank = int(os.environ["RANK"])
    name = f"rank-{rank}.json"
    (Path(args.out) / name).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
