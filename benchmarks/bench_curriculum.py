"""How long the pure curriculum takes to answer on a 10-million-chunk stream.

Usage: python benchmarks/bench_curriculum.py [--quick]

Prints milliseconds for construction + ``len()``, ``chunk(g)`` at several
positions (first call with a new per-chunk count pattern, then warm), and a
lane window far into the stream. Information only; nothing is asserted.
"""

from __future__ import annotations

import argparse
import statistics
import time

from zephon_dask.curriculum import MixtureWorkSource


class Sized:
    def __init__(self, name, sizes):
        self.name, self.shard_sizes = name, sizes


def ms(fn) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    reps = 5 if parser.parse_args().quick else 50
    datasets = [Sized("web", [10**9] * 10), Sized("code", [10**8] * 3)]
    build = ms(lambda: len(MixtureWorkSource(datasets, chunk_size=1000, seed=1)))
    ws = MixtureWorkSource(datasets, chunk_size=1000, seed=1)
    n = len(ws)
    first = ms(lambda: ws.chunk(n // 3))
    warm = [ms(lambda g=g: ws.chunk(g)) for g in range(n - reps, n)]
    window = [ms(lambda w=w: ws.window(5, 100_000 + w, 8, 8)) for w in range(reps)]
    print(f"stream: {n:,} chunks of 1000 pointers (2 datasets, 10.3 billion samples)")
    print(f"construct + len():          {build:8.2f} ms")
    print(f"chunk(g), first call:       {first:8.2f} ms  (includes the in-chunk interleave, cached after)")
    print(f"chunk(g), warm, median:     {statistics.median(warm):8.2f} ms  over {reps} chunks at the end")
    print(f"window(lane 5, w~100000):   {statistics.median(window):8.2f} ms  (8 lanes, k=8)")


if __name__ == "__main__":
    main()
