"""A Hugging Face training run that stops when preempted, run in tests/test_interrupts.py.

``ZephonTrainer`` with :class:`~zephon_dask.integrations.hf.StopOnPreemption` trains the tiny GPT-2
for up to ``--steps`` optimizer steps, each taking ``--step-s`` seconds longer (a model's step);
``--out/steps`` holds the last step finished. On SIGTERM or SIGINT it saves ``checkpoint-N`` at the
end of the step and exits with 128 + the signal. ``train`` is also what the test runs in process.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from frameworks import hf_pipeline, record_inputs, tiny_gpt2  # noqa: E402

import zephon_dask as z  # noqa: E402


def train(corpus: Path, out: Path, steps: int, resume: str | None = None, stop=None, step_s: float = 0.0):
    """Train; the digests of every input the model saw, and the model."""
    from transformers import TrainerCallback, TrainingArguments

    from zephon_dask.integrations.hf import StopOnPreemption, ZephonTrainer

    class Progress(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            time.sleep(step_s)
            (out / "steps").write_text(str(state.global_step))

    model = tiny_gpt2()
    seen = record_inputs(model)
    args = TrainingArguments(output_dir=str(out), max_steps=steps, save_strategy="no", learning_rate=1e-3,
                             report_to=[], logging_strategy="no", disable_tqdm=True, use_cpu=True, seed=0)
    callbacks = [Progress()] + ([StopOnPreemption(stop)] if stop is not None else [])
    with hf_pipeline(corpus) as pipe:
        ZephonTrainer(model=model, args=args, train_dataset=pipe, callbacks=callbacks).train(
            resume_from_checkpoint=resume)
    return seen, model


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--step-s", type=float, default=0.0)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with z.Preemption() as stop:
        train(Path(args.corpus), out, args.steps, stop=stop, step_s=args.step_s)
    return stop.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
