"""Resume cost through the training frameworks: the pipeline's state against the framework's skip.

Usage: python benchmarks/bench_frameworks.py [--quick] [--ks 0,100,1000] [--repeat 3] [--runner synchronous]

For each k, a checkpoint taken after k training steps (one batch per step) is
resumed, and the time from the framework's resume call to the first forward
of the model is measured (median over ``--repeat``; a forward pre-hook stops
the run there):

- HF Trainer, ours: ``ZephonTrainer.train(resume_from_checkpoint=checkpoint-k)``;
  the pipeline loads its state and computes batch k directly.
- HF Trainer, default skip: the stock resume of the same checkpoint without
  the pipeline's state: the Trainer calls accelerate's ``skip_first_batches``,
  which iterates and drops the k batches already trained.
- accelerate, ours: ``accelerator.load_state`` restores the loader registered by
  ``prepare_pipeline``; default skip: ``accelerator.skip_first_batches(loader, k)``.

The checkpoints are built once (the model and optimizer of a one-step run,
the trainer step set to k, the pipeline's state after k batches), so only the
resume is timed. Tiny GPT-2 from a config, CPU, a synthetic JSONL corpus.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

import zephon_dask as z

WORDS = [f"w{i}" for i in range(2000)]


class Reached(Exception):
    """Raised by the forward pre-hook: the first training step has its batch."""


def corpus(root: Path, files: int = 4, docs: int = 500) -> Path:
    rng = random.Random(0)
    for f in range(files):
        with open(root / f"part-{f}.jsonl", "w") as fh:
            for _ in range(docs):
                fh.write(json.dumps({"text": " ".join(rng.choices(WORDS, k=rng.randint(20, 400)))}) + "\n")
    return root


def pipeline(root: Path, runner: str):
    ds = z.Dataset.from_jsonl("web", str(root), progress=False)
    ws = z.MixtureWorkSource([ds], chunk_size=64, seed=3, exhausted_policy="repeat")
    # one lane: a global step is one batch, as the checkpoints after k steps here assume (the Trainer
    # integration sizes its gradient accumulation from the pipeline's step)
    return (z.Pipeline(ws).tokenize().pack(256, algorithm="best_fit").batch(2, labels="hf")
            .options(runner=runner, canonical_replicas=1, flush_every_k_chunks=2))


def model():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    m = GPT2LMHeadModel(GPT2Config(vocab_size=258, n_positions=256, n_embd=16, n_layer=1, n_head=2,
                                   bos_token_id=256, eos_token_id=257))

    def stop(module, args, kwargs):
        raise Reached

    m.register_forward_pre_hook(stop, with_kwargs=True)
    return m


def state_after(root: Path, runner: str, k: int) -> dict:
    """The pipeline's state after ``k`` delivered batches (built once per k, not timed)."""
    with pipeline(root, runner) as pipe:
        loader = pipe.to_torch_loader()
        for _, _ in zip(range(k), loader, strict=False):
            pass
        return loader.state_dict()


def timed(fn) -> float:
    t = time.perf_counter()
    try:
        fn()
    except Reached:
        return time.perf_counter() - t
    raise RuntimeError("the run ended before its first training step")


# -- Hugging Face Trainer -------------------------------------------------------------------

def hf_args(out: Path, max_steps: int):
    from transformers import TrainingArguments

    return TrainingArguments(output_dir=str(out), max_steps=max_steps, save_steps=1, report_to=[],
                             logging_strategy="no", disable_tqdm=True, use_cpu=True, seed=0)


def hf_checkpoint(work: Path, root: Path, runner: str, k: int, state: dict) -> Path:
    """``checkpoint-k``: a one-step run's model and optimizer, the step set to k, the data state at k."""
    from zephon_dask.integrations.hf import STATE_FILE, ZephonTrainer

    base = work / "hf-base" / "checkpoint-1"
    if not base.exists():
        m = model()
        m._forward_pre_hooks.clear()
        with pipeline(root, runner) as pipe:
            ZephonTrainer(model=m, args=hf_args(work / "hf-base", 1), train_dataset=pipe).train()
    checkpoint = work / f"hf-{k}" / f"checkpoint-{k}"
    shutil.copytree(base, checkpoint)
    trainer_state = json.loads((checkpoint / "trainer_state.json").read_text())
    trainer_state.update(global_step=k, max_steps=k + 10)
    (checkpoint / "trainer_state.json").write_text(json.dumps(trainer_state))
    z.save_state(checkpoint / STATE_FILE, state)
    return checkpoint


def hf_ours(root: Path, runner: str, checkpoint: Path, k: int) -> float:
    from zephon_dask.integrations.hf import ZephonTrainer

    with pipeline(root, runner) as pipe:
        trainer = ZephonTrainer(model=model(), args=hf_args(checkpoint.parent / "ours", k + 10), train_dataset=pipe)
        return timed(lambda: trainer.train(resume_from_checkpoint=str(checkpoint)))


def hf_skip(root: Path, runner: str, checkpoint: Path, k: int) -> float:
    """The Trainer's own resume: no data state, ``skip_first_batches`` over the pipeline's loader."""
    from transformers import Trainer

    class StockResume(Trainer):
        def get_train_dataloader(self):
            return self.train_dataset.to_torch_loader()

    with pipeline(root, runner) as pipe:
        trainer = StockResume(model=model(), args=hf_args(checkpoint.parent / "skip", k + 10), train_dataset=pipe)
        return timed(lambda: trainer.train(resume_from_checkpoint=str(checkpoint)))


# -- accelerate ------------------------------------------------------------------------------

def acc_checkpoint(work: Path, root: Path, runner: str, k: int, state: dict) -> Path:
    from accelerate import Accelerator

    from zephon_dask.integrations.accelerate import prepare_pipeline

    folder = work / f"acc-{k}"
    accelerator = Accelerator(cpu=True)
    m = model()
    opt = torch.optim.AdamW(m.parameters())
    m, opt = accelerator.prepare(m, opt)
    with pipeline(root, runner) as pipe:
        prepare_pipeline(accelerator, pipe)
        accelerator.save_state(str(folder))
    torch.save(state, folder / "custom_checkpoint_0.pkl")
    return folder


def acc_ours(root: Path, runner: str, folder: Path, k: int) -> float:
    from accelerate import Accelerator

    from zephon_dask.integrations.accelerate import prepare_pipeline

    accelerator = Accelerator(cpu=True)
    m = model()
    opt = torch.optim.AdamW(m.parameters())
    m, opt = accelerator.prepare(m, opt)
    with pipeline(root, runner) as pipe:
        loader = prepare_pipeline(accelerator, pipe)

        def resume():
            accelerator.load_state(str(folder))
            m(**{key: v for key, v in next(iter(loader)).items() if key == "input_ids"})

        return timed(resume)


def acc_skip(root: Path, runner: str, folder: Path, k: int) -> float:
    from accelerate import Accelerator

    from zephon_dask.integrations.accelerate import AcceleratorLoader

    skip_folder = folder.parent / f"{folder.name}-skip"
    if not skip_folder.exists():
        shutil.copytree(folder, skip_folder)
        (skip_folder / "custom_checkpoint_0.pkl").unlink()
    accelerator = Accelerator(cpu=True)
    m = model()
    opt = torch.optim.AdamW(m.parameters())
    m, opt = accelerator.prepare(m, opt)
    with pipeline(root, runner) as pipe:
        loader = AcceleratorLoader(pipe, device=accelerator.device)

        def resume():
            accelerator.load_state(str(skip_folder))
            skipped = accelerator.skip_first_batches(loader, k)
            m(input_ids=next(iter(skipped))["input_ids"])

        return timed(resume)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ks", default="0,100,1000")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--runner", default="synchronous")
    ap.add_argument("--quick", action="store_true", help="k in 0,20 once (a smoke run)")
    a = ap.parse_args()
    if a.quick:
        a.ks, a.repeat = "0,20", 1
    ks = [int(k) for k in a.ks.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "corpus").mkdir()
        root = corpus(work / "corpus")
        for k in ks:
            state = state_after(root, a.runner, k)
            hf_ck = hf_checkpoint(work, root, a.runner, k, state)
            acc_ck = acc_checkpoint(work, root, a.runner, k, state)
            cases = {"hf ours": (hf_ours, hf_ck), "hf skip": (hf_skip, hf_ck),
                     "accelerate ours": (acc_ours, acc_ck), "accelerate skip": (acc_skip, acc_ck)}
            times: dict[str, list[float]] = {name: [] for name in cases}
            for _ in range(a.repeat):  # interleaved, so load drifts hit every case alike
                for name, (case, checkpoint) in cases.items():
                    times[name].append(case(root, a.runner, checkpoint, k))
            rows.append((k, {name: statistics.median(v) for name, v in times.items()}))
            print(f"k={k}: " + ", ".join(f"{n} {t:.3f}s" for n, t in rows[-1][1].items()), flush=True)
    print(f"\nresume call -> first training step, median of {a.repeat} (runner={a.runner})")
    print(f"{'k':>6} | {'HF ours':>8} | {'HF skip':>8} | {'acc ours':>8} | {'acc skip':>8}")
    for k, t in rows:
        print(f"{k:>6} | {t['hf ours']:>7.3f}s | {t['hf skip']:>7.3f}s | {t['accelerate ours']:>7.3f}s | "
              f"{t['accelerate skip']:>7.3f}s")


if __name__ == "__main__":
    main()
