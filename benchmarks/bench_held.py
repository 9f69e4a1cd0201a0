"""Bytes held by finished windows: on each worker, in the training process, and its peak RSS.

Builds ``bench_e2e.py``'s ``mixed`` workload (prose plus Python source, BPE 8192, BOS/EOS,
``shuffle(1024)``, 8 chunks of 64 documents per window, ``pack(2048)``, ``batch(8)``,
``canonical_replicas=8``), then iterates one pass on the embedded cluster (default settings) in
a fresh "training process" per run, alternating the settings given (``--prefetch-bytes``:
none, then each value) ``--repeat`` times. While it runs, a thread samples every ``--every``
seconds:

* per worker, the bytes of task results it holds (the sum of their ``nbytes``, the
  dashboard's *managed* memory);
* in the training process, the bytes of windows fetched ahead and not taken yet, and of the
  windows the consumer is cutting into batches (one per lane).

It prints their peak and median, the training process's peak RSS (``VmHWM``), tokens/s and the
first batch, and checks the sha256 of every batch's ``tokens`` against the single-process
reference (the ``synchronous`` runner). Nothing asserts a time or a size.

    python benchmarks/bench_held.py [--quick] [--repeat N] [--every S] [--prefetch-bytes N ...]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_e2e  # noqa: E402  (the corpus, tokenizer and pipeline of its workloads)

CHILD_FLAG = "--child"
MIB = 2 ** 20


def stored_per_worker(dask_scheduler) -> dict[str, int]:
    """Bytes of task results each worker holds (runs on the scheduler)."""
    return {addr: sum(ts.nbytes for ts in ws.has_what) for addr, ws in dask_scheduler.workers.items()}


def held_here(stream) -> tuple[int, int]:
    """``(bytes of windows fetched ahead and not taken, bytes of the tables the lanes' batchers hold)``."""
    return stream.fetcher.held_nbytes, sum(b.held_nbytes for b in list(stream.batchers.values()))


def sample(pipeline, rows: list, stop: threading.Event, every: float) -> None:
    while not stop.wait(every):
        stream = getattr(pipeline.session, "stream", None)
        runner = pipeline.session.started_runner
        if stream is None:
            continue
        row = {"ahead": 0, "tables": 0, "workers": {}}
        try:
            row["ahead"], row["tables"] = held_here(stream)
            if runner is not None and not runner.starting and getattr(runner, "_client", None) is not None:
                row["workers"] = runner.client.run_on_scheduler(stored_per_worker)
        except Exception:  # a stream or a cluster closing: the next sample
            continue
        rows.append(row)


def child(args) -> None:
    """One pass in this process: the figures as one JSON line."""
    import numpy as np

    wl = bench_e2e.WORKLOADS["mixed"]
    p = bench_e2e.build_pipeline(wl, args.data, args.tokenizer, os.cpu_count() or 1)
    if args.prefetch_bytes:
        p = p.options(prefetch_bytes=args.prefetch_bytes)
    rows: list = []
    stop = threading.Event()
    sampler = threading.Thread(target=sample, args=(p, rows, stop, args.every), daemon=True)
    sampler.start()
    sha, tokens, first = hashlib.sha256(), 0, None
    t0 = time.perf_counter()
    for b in p:
        if first is None:
            first = time.perf_counter() - t0
        arr = np.ascontiguousarray(b["tokens"])
        sha.update(arr.tobytes())
        tokens += arr.size
    wall = time.perf_counter() - t0
    stop.set()
    sampler.join(timeout=10)
    p.close()
    hwm = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    per_worker = [v for r in rows for v in r["workers"].values()]
    print(json.dumps({
        "sha": sha.hexdigest(), "tokens_per_s": tokens / wall, "first_s": first, "rss": hwm,
        "worker_peak": max(per_worker, default=0), "worker_median": statistics.median(per_worker or [0]),
        "ahead_peak": max((r["ahead"] for r in rows), default=0),
        "here_peak": max((r["ahead"] + r["tables"] for r in rows), default=0),
        "here_median": statistics.median([r["ahead"] + r["tables"] for r in rows] or [0]),
    }))


def reference(data: str, tokenizer: str) -> str:
    """The sha256 of every batch's ``tokens``, in order, on the synchronous runner (this process)."""
    import numpy as np

    p = bench_e2e.build_pipeline(bench_e2e.WORKLOADS["mixed"], data, tokenizer, 1).options(runner="synchronous")
    sha = hashlib.sha256()
    with p:
        for b in p:
            sha.update(np.ascontiguousarray(b["tokens"]).tobytes())
    return sha.hexdigest()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a fifth of the corpus")
    ap.add_argument("--repeat", type=int, default=2, help="alternated rounds (default 2)")
    ap.add_argument("--every", type=float, default=0.1, help="seconds between samples")
    ap.add_argument("--prefetch-bytes", type=int, nargs="*", default=[],
                    help="also run with each of these prefetch_bytes (default: only without)")
    ap.add_argument(CHILD_FLAG, dest="child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--tokenizer", help=argparse.SUPPRESS)
    ap.add_argument("--one", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        args.prefetch_bytes = args.one
        child(args)
        return 0
    with tempfile.TemporaryDirectory(prefix="zephon-bench-held-") as tmp:
        tokenizer, summary = bench_e2e.make_data(tmp, bench_e2e.WORKLOADS["mixed"], args.quick, None)
        print(bench_e2e.WORKLOADS["mixed"].describe())
        print(summary)
        truth = reference(tmp, tokenizer)
        print(f"{'run':<28} {'worker MiB peak/median':>23} {'here MiB peak/median':>21} "
              f"{'ahead peak':>10} {'RSS MiB':>8} {'tok/s':>8} {'first s':>7}  batches")
        for r in range(args.repeat):
            for limit in [0, *args.prefetch_bytes]:
                cmd = [sys.executable, os.path.abspath(__file__), CHILD_FLAG, "--data", tmp, "--tokenizer", tokenizer,
                       "--every", str(args.every), "--one", str(limit)]
                out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True,
                                                timeout=1800).stdout.strip().splitlines()[-1])
                name = f"round {r + 1}, " + (f"prefetch_bytes={limit:,}" if limit else "defaults")
                same = "== reference" if out["sha"] == truth else "DIFFER from the reference"
                print(f"{name:<28} {out['worker_peak'] / MIB:>11.1f} / {out['worker_median'] / MIB:<9.1f} "
                      f"{out['here_peak'] / MIB:>9.1f} / {out['here_median'] / MIB:<9.1f} "
                      f"{out['ahead_peak'] / MIB:>10.1f} {out['rss'] / MIB:>8.0f} {out['tokens_per_s']:>8.0f} "
                      f"{out['first_s']:>7.2f}  {same}")
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
