"""A framework's training run, stopped by SIGTERM, as tests/integrations/test_interrupts.py sends it.

``--framework hf``: ``ZephonTrainer`` with :class:`~zephon_dask.integrations.hf.StopOnPreemption`
under :class:`zephon_dask.Preemption` saves ``checkpoint-N`` at the end of the step and exits with
128 + the signal. ``--framework lightning``: Lightning's own SIGTERM handling stops after the
current micro-batch and ``OnExceptionCheckpoint`` saves ``on_exception.ckpt``; ``ZephonDataModule``
puts the data state of the batches those weights trained in it. Both train the tiny GPT-2 (with
dropout) for up to ``--steps`` optimizer steps, each ``--step-s`` seconds longer (a model's step);
``--out/steps`` holds the last step finished. With ``--at-once`` the run is under
``Preemption(at_once=True)`` with each framework's ``StopOnPreemption``; with ``--sleep-at F``
training forward F (from 0) sleeps a minute, writing ``--out/sleeping`` before and ``--out/woke``
after. The ``train_*`` functions are what the test runs in process.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: tests.helpers

import zephon_dask as z  # noqa: E402
from tests.helpers.frameworks import hf_pipeline, lightning_module, record_inputs, tiny_gpt2  # noqa: E402

DROPOUT = 0.1
LONG_S = 60.0  # the long forward's sleep: far longer than a save and an exit


def sleep_in_forward(model, out: Path, at: int | None) -> None:
    """Training forward ``at`` (counted from 0) sleeps :data:`LONG_S`, between two marker files."""
    count = [0]

    def hook(module, args, kwargs):
        if module.training:
            if count[0] == at:
                (out / "sleeping").write_text("")
                time.sleep(LONG_S)
                (out / "woke").write_text("")
            count[0] += 1

    if at is not None:
        model.register_forward_pre_hook(hook, with_kwargs=True)


def train_hf(corpus: Path, out: Path, steps: int, resume: str | None = None, stop=None, step_s: float = 0.0,
             sleep_at: int | None = None):
    """Train; the digests of every input the model saw, and the model."""
    from transformers import TrainerCallback, TrainingArguments

    from zephon_dask.integrations.hf import StopOnPreemption, ZephonTrainer

    class Progress(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            time.sleep(step_s)
            (out / "steps").write_text(str(state.global_step))

    out.mkdir(parents=True, exist_ok=True)
    model = tiny_gpt2(dropout=DROPOUT)
    seen = record_inputs(model)
    sleep_in_forward(model, out, sleep_at)
    args = TrainingArguments(output_dir=str(out), max_steps=steps, save_strategy="no", learning_rate=1e-3,
                             report_to=[], logging_strategy="no", disable_tqdm=True, use_cpu=True, seed=0)
    callbacks = [Progress()] + ([StopOnPreemption(stop)] if stop is not None else [])
    with hf_pipeline(corpus) as pipe:
        ZephonTrainer(model=model, args=args, train_dataset=pipe, callbacks=callbacks).train(
            resume_from_checkpoint=resume)
    return seen, model


def train_lightning(corpus: Path, out: Path, steps: int, resume: str | None = None, step_s: float = 0.0,
                    stop=None, sleep_at: int | None = None):
    """As :func:`train_hf`, through Lightning (``stop``: an at-once :class:`~zephon_dask.Preemption`)."""
    import pytorch_lightning as pl
    from pytorch_lightning.callbacks import OnExceptionCheckpoint

    from zephon_dask.integrations import lightning

    class Progress(pl.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            time.sleep(step_s)
            (out / "steps").write_text(str(trainer.global_step))

    out.mkdir(parents=True, exist_ok=True)
    module = lightning_module(dropout=DROPOUT)
    sleep_in_forward(module.model, out, sleep_at)
    at_once = [lightning.StopOnPreemption(stop)] if stop is not None else []
    trainer = pl.Trainer(max_steps=steps, accelerator="cpu", logger=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
                         callbacks=[Progress(), *at_once, OnExceptionCheckpoint(dirpath=str(out))])
    with hf_pipeline(corpus) as pipe:
        trainer.fit(module, datamodule=lightning.ZephonDataModule(pipe), ckpt_path=resume)
    return module.seen, module


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--framework", choices=("hf", "lightning"), required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--step-s", type=float, default=0.0)
    ap.add_argument("--at-once", action="store_true", help="Preemption(at_once=True)")
    ap.add_argument("--sleep-at", type=int, default=None, metavar="F", help="training forward F sleeps a minute")
    args = ap.parse_args()
    out, at_once = Path(args.out), args.at_once
    torch.set_num_threads(1)  # as the test's own runs: a step's sums then come out the same, bit for bit
    if args.framework == "lightning" and not at_once:  # Lightning handles SIGTERM itself
        train_lightning(Path(args.corpus), out, args.steps, step_s=args.step_s, sleep_at=args.sleep_at)
        return 0
    with z.Preemption(at_once=at_once) as stop:
        try:
            train = train_lightning if args.framework == "lightning" else train_hf
            train(Path(args.corpus), out, args.steps, stop=stop, step_s=args.step_s, sleep_at=args.sleep_at)
        except z.Preempted:
            pass
        except SystemExit:  # Lightning ends a fit it stopped on an interrupt with sys.exit(1)
            if not stop.requested:
                raise
    return stop.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
