"""Resume cost through torchdata's StatefulDataLoader does not grow with the position.

Usage: python benchmarks/bench_stateful_loader.py [--quick] [--workers N]

An endless stream over a generated JSONL corpus, 8 lanes. For each cut k in
(0, 100, 800) a loader is run for k batches and its state taken; a fresh
loader loads it and the time from ``load_state_dict`` to the first batch is
measured (median over repetitions). Two datasets are compared:
``pipeline.to_torch_dataset()`` (torchdata's ``Stateful``: one window per lane
is recomputed) and the same stream behind a plain ``IterableDataset`` wrapper,
which torchdata resumes by re-iterating k batches (its default).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from torch.utils.data import IterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader

sys.path.insert(0, str(Path(__file__).parent))

from bench_resume import corpus  # noqa: E402

import zephon_dask as z  # noqa: E402


class NotStateful(IterableDataset):
    """The pipeline's dataset without state_dict/load_state_dict: torchdata's default resume."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __iter__(self):
        return iter(self.dataset)


def make(ds, stateful: bool, workers: int):
    ws = z.MixtureWorkSource([ds], chunk_size=64, seed=3, exhausted_policy="repeat")
    pipe = (z.Pipeline(ws).tokenize().pack(512, algorithm="best_fit").batch(4)
            .options(runner="synchronous", canonical_replicas=8, flush_every_k_chunks=4))
    data = pipe.to_torch_dataset()
    return pipe, StatefulDataLoader(data if stateful else NotStateful(data), batch_size=None,
                                    num_workers=workers, multiprocessing_context="fork" if workers else None)


def resume_seconds(ds, k: int, stateful: bool, workers: int) -> float:
    pipe, first = make(ds, stateful, workers)
    it = iter(first)
    for _ in range(k):
        next(it)
    state = first.state_dict()
    del it, first
    pipe.close()
    pipe, second = make(ds, stateful, workers)
    start = time.perf_counter()
    second.load_state_dict(state)
    next(iter(second))
    elapsed = time.perf_counter() - start
    pipe.close()
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one repetition, cuts 0 and 100")
    ap.add_argument("--workers", type=int, default=0, help="DataLoader workers (default 0)")
    args = ap.parse_args()
    cuts = (0, 100) if args.quick else (0, 100, 800)
    repeat = 1 if args.quick else 3
    with tempfile.TemporaryDirectory() as tmp:
        ds = z.Dataset.from_jsonl("web", str(corpus(Path(tmp))), progress=False)
        print(f"StatefulDataLoader, num_workers={args.workers}: seconds from load_state_dict to the "
              f"first batch (median of {repeat})")
        print(f"{'k':>6}  {'Stateful dataset':>17}  {'re-iterate k (default)':>23}")
        base = {}
        for k in cuts:
            row = []
            for stateful in (True, False):
                t = statistics.median(resume_seconds(ds, k, stateful, args.workers) for _ in range(repeat))
                base.setdefault(stateful, t)
                row.append(f"{t:7.3f} ({t / base[stateful]:4.1f}x)")
            print(f"{k:>6}  {row[0]:>17}  {row[1]:>23}")


if __name__ == "__main__":
    main()
