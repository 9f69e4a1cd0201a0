"""Resume cost does not grow with how far the run has gone.

Usage: python benchmarks/bench_resume.py [--quick] [--runner synchronous|threads|distributed]

An endless stream (``exhausted_policy="repeat"``) over a JSONL corpus, 8
lanes. For each lane window W in (0, 1e3, 1e6, 1e9) a fresh pipeline loads a
state whose every lane sits at window W, offset 3, and the time from
``load_state_dict`` to the first batch is measured (median over repetitions,
the positions interleaved).
Window 0 is the fresh start; the other rows print their ratio to it. With the
distributed runner the cluster is started once, before timing.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import zephon_dask as z

WORDS = [f"w{i}" for i in range(2000)]


def corpus(root: Path, files: int = 4, docs: int = 500) -> Path:
    rng = random.Random(0)
    for f in range(files):
        with open(root / f"part-{f}.jsonl", "w") as fh:
            for _ in range(docs):
                fh.write(json.dumps({"text": " ".join(rng.choices(WORDS, k=rng.randint(20, 400)))}) + "\n")
    return root


def pipeline(ds, runner, client):
    ws = z.MixtureWorkSource([ds], chunk_size=64, seed=3, exhausted_policy="repeat")
    options = {"runner": runner, "canonical_replicas": 8, "flush_every_k_chunks": 4}
    if client is not None:
        options["client"] = client
    return z.Pipeline(ws).tokenize().pack(2048, algorithm="best_fit").batch(8).options(**options)


def first_batch_seconds(ds, runner, client, window: int) -> float:
    pipe = pipeline(ds, runner, client)
    state = pipe.state_dict()
    for lane in state["lanes"].values():
        lane.update(window=window, offset=3 if window else 0, batches_delivered=window * 4)
    t = time.perf_counter()
    pipe.load_state_dict(state)
    next(iter(pipe))
    elapsed = time.perf_counter() - t
    pipe.close()
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--runner", default="threads", choices=["synchronous", "threads", "distributed"])
    args = ap.parse_args()
    reps = 3 if args.quick else 7
    with tempfile.TemporaryDirectory() as tmp:
        ds = z.Dataset.from_jsonl("web", str(corpus(Path(tmp))), progress=False)
        client = cluster = None
        if args.runner == "distributed":
            from distributed import Client, LocalCluster

            cluster = LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0")
            client = Client(cluster, set_as_default=False)
        try:
            first_batch_seconds(ds, args.runner, client, 0)  # warm the index and imports
            windows = (0, 10**3, 10**6, 10**9)
            times = {w: [] for w in windows}
            for _ in range(reps):  # interleaved, so background noise hits every row alike
                for w in windows:
                    times[w].append(first_batch_seconds(ds, args.runner, client, w))
            rows = [(w, statistics.median(t), min(t), max(t)) for w, t in times.items()]
        finally:
            if client is not None:
                client.close()
                cluster.close()
    fresh = rows[0][1]
    print(f"runner={args.runner}, 8 lanes, chunk_size=64, k=4, pack 2048, {reps} repetitions")
    print(f"{'resume at lane window':>24} {'first batch (median)':>21} {'min':>8} {'max':>8} {'vs fresh':>9}")
    for window, median, lo, hi in rows:
        label = "fresh start (0)" if window == 0 else f"{window:,}"
        print(f"{label:>24} {median * 1e3:>18.1f} ms {lo * 1e3:>6.1f}ms {hi * 1e3:>6.1f}ms {median / fresh:>8.2f}x")


if __name__ == "__main__":
    main()
