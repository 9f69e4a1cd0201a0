"""How ``zephon-dask run`` ends when interrupted: seconds from the signal to the exit, the lines it
prints besides its progress bar, the processes left behind, and whether its checkpoint resumes exactly.

    python benchmarks/bench_interrupt.py [--quick] [--rounds N]

Each round runs the example recipe (its stream lengthened) three ways, alternated: on the
embedded cluster interrupted by SIGINT sent to its whole process group (Ctrl-C in a
terminal), on the embedded cluster sent SIGTERM (a job scheduler's preemption), and on the
``threads`` runner sent SIGINT (no cluster: the floor). The signal goes after a fixed number
of delivered batches (read from the ledger). The ratios compare each cluster case with the
floor measured in the same round. Every checkpoint is resumed for a few steps and verified
against an uninterrupted run through the ledger.
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one round")
    ap.add_argument("--rounds", type=int, default=None, help="rounds of the three cases (default 3; --quick 1)")
    ap.add_argument("--after", type=int, default=200, help="batches delivered before the signal")
    args = ap.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 3)
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
