"""How ``zephon-dask run`` ends when interrupted: seconds from the signal to the exit, the lines it
prints besides its progress bar, the processes left behind, and whether its checkpoint resumes exactly.

    python benchmarks/bench_interrupt.py [--quick] [--rounds N]
    python benchmarks/bench_interrupt.py --trainers [--rounds N]

Each round runs the example recipe (its stream lengthened) three ways, alternated: on the
embedded cluster interrupted by SIGINT sent to its whole process group (Ctrl-C in a
terminal), on the embedded cluster sent SIGTERM (a job scheduler's preemption), and on the
``threads`` runner sent SIGINT (no cluster: the floor). The signal goes after a fixed number
of delivered batches (read from the ledger). The ratios compare each cluster case with the
floor measured in the same round. Every checkpoint is resumed for a few steps and verified
against an uninterrupted run through the ledger.

``--trainers``: a training step longer than a job scheduler's grace period. A tiny model
trains under the Hugging Face ``Trainer`` or Lightning until one micro-batch's forward takes a
minute; SIGTERM arrives during it. Stopped at once (``Preemption(at_once=True)`` and the
framework's ``StopOnPreemption``) against the end-of-step stop: seconds from the signal to the
exit, the exit status, and the global step of the checkpoint written (the tests check that it
resumes exactly).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
CASES = (("cluster, SIGINT to the group", None, signal.SIGINT, True),
         ("cluster, SIGTERM to the process", None, signal.SIGTERM, False),
         ("threads, SIGINT to the group", "threads", signal.SIGINT, True))


def recipe(folder: Path) -> Path:
    text = (ROOT / "examples" / "recipe.toml").read_text()
    text = text.replace('path = "data/', f'path = "{ROOT}/examples/data/')
    text = text.replace("stop_after_passes = 20", "stop_after_passes = 2000")
    path = folder / "recipe.toml"
    path.write_text(text)
    return path


def ledger_lines(folder: Path) -> int:
    return sum(p.read_bytes().count(b"\n") for p in folder.glob("rank-*.jsonl"))


def zephon(*args: str) -> list[str]:
    return [sys.executable, "-m", "zephon_dask.cli", *args]


def one(path: Path, work: Path, runner: str | None, sig: int, group: bool, after: int) -> dict:
    """Interrupt one run after ``after`` batches; its exit time, lines, leftovers and resume check."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    ledger, ckpt = work / "split", work / "ckpt.json"
    cmd = zephon("run", str(path), "--steps", "100000", "--checkpoint", str(ckpt), "--ledger", str(ledger),
                 *(["--runner", runner] if runner else []))
    with open(work / "out", "w") as out, open(work / "err", "w") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while ledger_lines(ledger) < after and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        family = psutil.Process(proc.pid).children(recursive=True)
        sent = time.perf_counter()
        (os.killpg if group else os.kill)(proc.pid, sig)
        proc.wait(120)
        exited = time.perf_counter() - sent
        time.sleep(2.0)  # the embedded scheduler checks its parent every second
        left = [p for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = (work / "out").read_text() + (work / "err").read_text().replace("\r", "\n")
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("global steps")]
    import zephon_dask as z

    done = z.load_state(ckpt)["step"]["global_step"]
    ok = (subprocess.run(zephon("run", str(path), "--steps", "4", "--resume", str(ckpt), "--runner", "threads",
                                "--ledger", str(ledger)), capture_output=True).returncode == 0
          and subprocess.run(zephon("run", str(path), "--steps", str(done + 4), "--runner", "threads",
                                    "--ledger", str(work / "whole")), capture_output=True).returncode == 0
          and subprocess.run(zephon("verify", str(work / "whole"), str(ledger)), capture_output=True).returncode == 0)
    return {"exit_s": exited, "status": proc.returncode, "lines": len(lines) - 2, "left": len(left), "exact": ok}


TRAINER_CASES = (("Trainer, at once", "hf", True), ("Lightning, at once", "lightning", True),
                 ("Trainer, at the step's end", "hf", False), ("floor: the imports' exit", None, True))
FLOOR = ("import signal, sys, time, torch, transformers, pytorch_lightning\n"
         "from transformers import Trainer\n"
         "signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))\n"
         "open(sys.argv[1], 'w').close()\n"
         "time.sleep(600)\n")
AT_STEP = 3  # the step whose second micro-batch's forward takes a minute


def trainer_case(work: Path, corpus: Path, framework: str, at_once: bool) -> dict:
    """SIGTERM while a forward of step ``AT_STEP`` sleeps a minute; seconds to the exit and the
    checkpoint's global step (``None``: none written)."""
    shutil.rmtree(work, ignore_errors=True)
    out = work / "run"
    cmd = [sys.executable, str(ROOT / "tests" / "jobs" / "preempted_trainer_job.py"), "--framework", framework,
           "--corpus", str(corpus), "--out", str(out), "--steps", "12", "--sleep-at", str(4 * AT_STEP + 1),
           *(["--at-once"] if at_once else [])]
    if framework is None:  # the same imports, then a plain exit on SIGTERM: the interpreter's own teardown
        out.mkdir(parents=True)
        cmd = [sys.executable, "-c", FLOOR, str(out / "sleeping")]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not (out / "sleeping").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        sent = time.perf_counter()
        os.kill(proc.pid, signal.SIGTERM)
        saved = None
        while proc.poll() is None and time.perf_counter() - sent < 180:
            if saved is None and (list(out.glob("checkpoint-*/zephon_state.json"))
                                  or (out / "on_exception.ckpt").exists()):
                saved = time.perf_counter() - sent
            time.sleep(0.01)
        exited = time.perf_counter() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    import torch

    done = [int(p.name.split("-")[1]) for p in out.glob("checkpoint-*")]
    if (out / "on_exception.ckpt").exists():
        done.append(torch.load(out / "on_exception.ckpt", weights_only=True)["global_step"])
    return {"exit_s": exited, "saved_s": exited if saved is None else saved, "status": proc.returncode,
            "step": max(done) if done else None}


def trainers(rounds: int, tmp: Path) -> int:
    sys.path.insert(0, str(ROOT))
    from tests.helpers.pipelines import write_corpus

    corpus = tmp / "corpus"
    write_corpus(corpus / "web", 3, 60, 1, "web")
    write_corpus(corpus / "code", 2, 50, 2, "code")
    results: dict[str, list[dict]] = {name: [] for name, *_ in TRAINER_CASES}
    for r in range(rounds):
        for name, framework, at_once in TRAINER_CASES:
            res = trainer_case(tmp / "trainer", corpus, framework, at_once)
            results[name].append(res)
            print(f"round {r + 1}: {name:28s} checkpoint after {res['saved_s']:6.2f} s, exit after "
                  f"{res['exit_s']:6.2f} s, status {res['status']}, checkpoint of step {res['step']}", flush=True)
    print(f"\n{'case (forward of a minute)':30s} {'saved (median)':>15s} {'exit (median)':>14s} {'step':>6s}")
    for name, framework, _ in TRAINER_CASES:
        runs = results[name]
        saved = f"{statistics.median(r['saved_s'] for r in runs):13.2f} s" if framework else f"{'-':>15s}"
        print(f"{name:30s} {saved} "
              f"{statistics.median(r['exit_s'] for r in runs):12.2f} s "
              f"{str(sorted({r['step'] for r in runs}, key=str)):>6s}")
    return 0 if all(r["step"] is not None for name, framework, _ in TRAINER_CASES if framework
                    for r in results[name]) else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one round")
    ap.add_argument("--rounds", type=int, default=None, help="rounds of the three cases (default 3; --quick 1)")
    ap.add_argument("--after", type=int, default=200, help="batches delivered before the signal")
    ap.add_argument("--trainers", action="store_true", help="SIGTERM during a minute-long training step")
    args = ap.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 3)
    if args.trainers:
        tmp = Path(tempfile.mkdtemp(prefix="zephon-bench-interrupt-"))
        try:
            return trainers(rounds, tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix="zephon-bench-interrupt-"))
    try:
        path = recipe(tmp)
        results: dict[str, list[dict]] = {name: [] for name, *_ in CASES}
        for r in range(rounds):
            for name, runner, sig, group in CASES:
                res = one(path, tmp / "run", runner, sig, group, args.after)
                results[name].append(res)
                print(f"round {r + 1}: {name:33s} exit after {res['exit_s']:5.2f} s, status {res['status']}, "
                      f"{res['lines']} line(s) besides its two, {res['left']} process(es) "
                      f"left, resume exact: {res['exact']}", flush=True)
        floor = results[CASES[-1][0]]
        print(f"\n{'case':35s} {'exit (median)':>14s} {'/ threads':>10s} {'lines':>6s} {'left':>5s} exact")
        for name, *_ in CASES:
            runs = results[name]
            ratios = [a["exit_s"] / max(b["exit_s"], 1e-3) for a, b in zip(runs, floor, strict=True)]
            print(f"{name:35s} {statistics.median(r['exit_s'] for r in runs):12.2f} s "
                  f"{statistics.median(ratios):9.2f}x {max(r['lines'] for r in runs):6d} "
                  f"{max(r['left'] for r in runs):5d} {all(r['exact'] for r in runs)}")
        return 0 if all(r["exact"] and not r["left"] for runs in results.values() for r in runs) else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
