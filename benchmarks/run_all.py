"""Run every ``benchmarks/bench_*.py`` in its own subprocess and print its output under a heading.

    python benchmarks/run_all.py [--quick]

``--quick`` is passed through to each script. Scripts run one after another
with this interpreter (never in parallel: they time themselves). The exit
status is non-zero if any script failed; a slow figure never fails a run.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Run every benchmarks/bench_*.py.")
    ap.add_argument("--quick", action="store_true", help="pass --quick to every benchmark")
    args = ap.parse_args(argv)
    scripts = sorted(HERE.glob("bench_*.py"))
    if not scripts:
        print(f"no bench_*.py in {HERE}")
        return 1
    failed = []
    for script in scripts:
        cmd = [sys.executable, str(script), *(["--quick"] if args.quick else [])]
        title = f"{script.name}{' --quick' if args.quick else ''}"
        print(f"\n{'=' * 78}\n== {title}\n{'=' * 78}", flush=True)
        t0 = time.perf_counter()
        rc = subprocess.run(cmd, cwd=HERE.parent).returncode
        print(f"-- {script.name}: {'ok' if rc == 0 else f'FAILED (exit {rc})'} "
              f"in {time.perf_counter() - t0:.1f} s", flush=True)
        if rc != 0:
            failed.append(script.name)
    print(f"\n{len(scripts) - len(failed)}/{len(scripts)} benchmarks ran"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
