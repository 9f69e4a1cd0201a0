"""Cost per window of ``ensure_mixture`` (strict and not), beside packing the same window.

Builds one synthetic window of two datasets mixed 50/50 (fixed-seed lognormal
document lengths, mean ~300 tokens), drops 3 of 4 documents of the second (the
filter the accumulator corrects), and times ``ensure_mixture`` on what is left,
in samples and in tokens, strict and not, with ``pack(2048, "wrap")`` on the same
window for scale. Prints milliseconds per window, microseconds per document and
the delivered share of the second dataset. Timings are medians of a few runs;
nothing asserts a time.

    python benchmarks/bench_mixture.py [--quick]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import numpy as np

from zephon_dask.operators.base import WindowContext
from zephon_dask.operators.mixture import EnsureMixture, dataset_of
from zephon_dask.operators.pack import Pack
from zephon_dask.operators.table import SampleTable

NAMES = ("a", "b")


def filtered_window(n_docs: int, seed: int = 0) -> SampleTable:
    """``n_docs`` documents alternating a/b, then 3 of every 4 of b dropped."""
    rng = np.random.default_rng(seed)
    lengths = np.maximum(1, rng.lognormal(np.log(300) - 0.5, 1.0, n_docs).round()).astype(np.int64)
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    tokens = rng.integers(0, 50_000, int(offsets[-1]), dtype=np.int32)
    lineage = np.zeros((n_docs, 5), dtype=np.int64)
    lineage[:, 0] = np.arange(n_docs) % 2
    lineage[:, 2] = np.arange(n_docs)
    lineage[:, 4] = lengths
    table = SampleTable.from_documents(tokens, offsets, lineage)
    keep = np.flatnonzero((lineage[:, 0] == 0) | (np.arange(n_docs) % 8 == 1))
    return table.take(keep)


def median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        gc.collect()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one window of 2,048 documents, 3 runs each")
    args = ap.parse_args()
    n_docs, repeats = (2048, 3) if args.quick else (16_384, 5)
    table = filtered_window(n_docs)
    allocated = np.array([n_docs // 2, n_docs - n_docs // 2])
    print(f"one window: {len(table):,} documents left of {n_docs:,} drawn 50/50 "
          f"(3 of 4 of 'b' filtered out), {int(table.offsets[-1]):,} tokens")
    print(f"{'operator':<44} {'ms/window':>10} {'us/doc':>8} {'share of b':>11}")
    cases = [(f"ensure_mixture(weight_by={by!r}, strict={strict})",
              EnsureMixture(NAMES, weight_by=by, strict=strict,
                            **({"weights": {"a": 1, "b": 1}} if by == "tokens" else {})))
             for by in ("samples", "tokens") for strict in (False, True)]
    cases.append(("pack(2048, 'wrap') (for scale)", Pack(2048, "wrap")))
    for label, op in cases:
        def run(op=op):
            return op.apply(table, WindowContext(0, 0, 0, NAMES, allocated=allocated))

        ms = median_ms(run, repeats)
        out = run()
        ds = dataset_of(out) if label.startswith("ensure") else None
        share = f"{np.mean(ds == 1):.3f}" if ds is not None and len(ds) else ""
        print(f"{label:<44} {ms:>10.2f} {ms * 1e3 / len(table):>8.2f} {share:>11}")


if __name__ == "__main__":
    main()
