"""What cutting and recording one batch costs the training process, between training steps.

Builds synthetic windows shaped like ``bench_e2e.py``'s ``mixed`` workload
(documents of two datasets packed into rows of 2048 tokens, ~140 rows a
window), feeds them to one :class:`LaneBatcher` per lane (8 lanes, batches of
8, round-robin), and between two batches runs a fixed step like
``bench_e2e.py``'s (pure Python, then small torch matmuls), which leaves the
code and the data out of the caches, as in a training loop. Prints the
mean thread CPU per batch of ``pop()`` (a window pushed when a lane needs
one, as the stream does) and of recording the batch as the pipeline does
(``Progress.observe_batch``), in several rounds; nothing
asserts a time.

    python benchmarks/bench_batcher.py [--quick] [--rounds N]
"""

from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace

import numpy as np
import torch

from zephon_dask.consumer import BatchOptions, LaneBatcher
from zephon_dask.operators.base import WindowContext
from zephon_dask.operators.pack import Pack
from zephon_dask.operators.table import SampleTable
from zephon_dask.state.progress import Progress, StepShape

LANES, MICROBATCH, SEQ_LEN, DOCS = 8, 8, 2048, 512
NAMES = ("prose", "code")


def window(seed: int) -> SampleTable:
    """~512 documents (lognormal lengths, mean ~550 tokens) of two datasets, packed (wrap)."""
    rng = np.random.default_rng(seed)
    lengths = np.maximum(1, rng.lognormal(np.log(550) - 0.5, 1.0, DOCS).round()).astype(np.int64)
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    lineage = np.zeros((DOCS, 5), dtype=np.int64)
    lineage[:, 0] = rng.integers(0, len(NAMES), DOCS)
    lineage[:, 2] = np.arange(DOCS)
    lineage[:, 4] = lengths
    table = SampleTable.from_documents(rng.integers(0, 8192, int(offsets[-1]), dtype=np.int32), offsets, lineage)
    return Pack(SEQ_LEN, "wrap").apply(table, WindowContext(seed=0, lane=0, window=seed, dataset_names=NAMES))


def step() -> None:
    """A fixed CPU step (as ``bench_e2e.py``'s, shorter): pure Python, then torch matmuls."""
    acc = 0
    for i in range(50_000):
        acc += i * i
    a = torch.full((256, 256), float(acc % 3), dtype=torch.float32)
    for _ in range(4):
        a = torch.tanh(a @ a / 256)


def run(batches: int, windows: list[SampleTable]) -> tuple[float, float]:
    """Mean thread CPU (ms) of ``pop()`` and of recording, per batch, over ``batches`` batches."""
    opts = BatchOptions(microbatch_size=MICROBATCH)
    batchers = [LaneBatcher(lane, opts, NAMES) for lane in range(LANES)]
    spec = SimpleNamespace(fingerprint="bench", config=dict, source=SimpleNamespace(names=NAMES))
    progress = Progress(spec, list(range(LANES)), None, StepShape(LANES, LANES, 1, False, MICROBATCH))
    pushed = [0] * LANES
    pops, records = [], []
    for k in range(batches):
        lane = k % LANES
        batcher = batchers[lane]
        while not batcher.ready():
            batcher.push(pushed[lane], windows[(pushed[lane] * LANES + lane) % len(windows)])
            pushed[lane] += 1
        step()
        c = time.thread_time()
        batch = batcher.pop()
        c1 = time.thread_time()
        progress.observe_batch(batch)
        c2 = time.thread_time()
        pops.append(c1 - c)
        records.append(c2 - c1)
    return sum(pops) / len(pops) * 1e3, sum(records) / len(records) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer batches per round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    windows = [window(seed) for seed in range(4)]
    batches = 400 if args.quick else 1600
    rows = statistics.median(len(w) for w in windows)
    print(f"{LANES} lanes, batch({MICROBATCH}), rows of {SEQ_LEN}, ~{rows:.0f} rows a window; "
          f"{batches} batches a round, a step between two")
    print("round  pop() ms/batch  record ms/batch")
    for r in range(args.rounds):
        pop, record = run(batches, windows)
        print(f"{r:5d}  {pop:14.3f}  {record:15.3f}")


if __name__ == "__main__":
    main()
