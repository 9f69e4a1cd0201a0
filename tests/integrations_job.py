"""Framework training runs under ``torchrun`` (gloo, CPU), for tests/test_integrations_*.py.

Each rank trains a tiny model through the framework's zephon_dask integration
and writes the digests of the ``input_ids`` its model received to
``--out/rank-<r>.json`` (with ``--tag``, ``rank-<r>-<tag>.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from frameworks import SAVE_AT, STEPS, hf_pipeline, record_inputs, tiny_gpt2  # noqa: E402


def run_hf(args) -> list[str]:
    from transformers import TrainingArguments

    from zephon_dask.integrations.hf import ZephonTrainer

    model = tiny_gpt2()
    seen = record_inputs(model)
    targs = TrainingArguments(output_dir=str(Path(args.out) / "hf"), max_steps=STEPS, save_strategy="steps",
                              save_steps=SAVE_AT, report_to=[], logging_strategy="no", disable_tqdm=True,
                              use_cpu=True, seed=0, ddp_backend="gloo")
    with hf_pipeline(Path(args.corpus), runner="threads") as pipe:
        ZephonTrainer(model=model, args=targs, train_dataset=pipe).train(resume_from_checkpoint=args.resume)
    return seen


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--framework", required=True, choices=["hf", "lightning", "accelerate"])
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--resume")
    ap.add_argument("--tag", default="")
    args = ap.parse_args()
    seen = {"hf": run_hf}[args.framework](args)
    rank = int(os.environ["RANK"])
    name = f"rank-{rank}-{args.tag}.json" if args.tag else f"rank-{rank}.json"
    (Path(args.out) / name).write_text(json.dumps({"inputs": seen}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
