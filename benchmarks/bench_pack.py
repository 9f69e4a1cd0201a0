"""Throughput of ``Pack`` against a straightforward pure-Python packer, in one run.

Builds one synthetic window (fixed-seed lognormal document lengths, mean ~300
tokens), packs it with each algorithm, checks the output equals the pure-Python
packer's, and prints packed tokens/s, the speed-up, the packing efficiency
(tokens / slots), the share of the window's tokens kept (``wrap`` and
``best_fit_wrap`` drop the leftover under one row) and the documents cut. Timings are medians of a few runs; nothing asserts a time.

    python benchmarks/bench_pack.py [--quick]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import numpy as np

from zephon_dask.operators.base import WindowContext
from zephon_dask.operators.pack import DEFAULT_NUM_BINS, Pack
from zephon_dask.operators.table import SampleTable

ALGORITHMS = ("wrap", "first_fit", "best_fit", "best_fit_wrap")


def synthetic_window(n_docs: int, seed: int = 0) -> SampleTable:
    rng = np.random.default_rng(seed)
    lengths = np.maximum(1, rng.lognormal(np.log(300) - 0.5, 1.0, n_docs).round()).astype(np.int64)
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    tokens = rng.integers(0, 50_000, int(offsets[-1]), dtype=np.int32)
    lineage = np.zeros((n_docs, 5), dtype=np.int64)
    lineage[:, 2] = np.arange(n_docs)
    lineage[:, 4] = lengths
    return SampleTable.from_documents(tokens, offsets, lineage)


def python_pack(docs, lineage, length, algorithm, pad_id=0, num_bins=DEFAULT_NUM_BINS):
    """Pure-Python packer with the same semantics: returns (tokens, positions, doc_ids, lineage)."""
    if algorithm == "wrap":
        rows, row, room = [], [], length
        for d, doc in enumerate(docs):
            start = 0
            while start < len(doc):
                take = min(room, len(doc) - start)
                row.append((d, start, take))
                start += take
                room -= take
                if room == 0:
                    rows.append(row)
                    row, room = [], length
    elif algorithm == "best_fit_wrap":
        pool = [(len(doc), -d, 0) for d, doc in enumerate(docs) if doc]  # (size, -doc, start)
        rows = []
        while sum(p[0] for p in pool) >= length:
            row, room = [], length
            while room:
                fits = [p for p in pool if p[0] <= room]
                piece = max(fits or pool)
                pool.remove(piece)
                size, neg, start = piece
                take = min(size, room)
                row.append((-neg, start, take))
                if take < size:
                    pool.append((size - take, neg, start + take))
                room -= take
            rows.append(row)
    else:
        pieces = [
            (d, s, min(length, len(doc) - s))
            for d, doc in enumerate(docs)
            for s in range(0, len(doc), length)
        ]
        rows, open_bins, rooms = [], [], []
        for piece in pieces:
            n = piece[2]
            fit = [j for j, r in enumerate(rooms) if r >= n]
            if fit:
                j = fit[0] if algorithm == "first_fit" else min(fit, key=rooms.__getitem__)
                open_bins[j].append(piece)
                rooms[j] -= n
                continue
            if len(open_bins) == num_bins:
                j = min(range(len(rooms)), key=rooms.__getitem__)
                rows.append(open_bins.pop(j))
                rooms.pop(j)
            open_bins.append([piece])
            rooms.append(length - n)
        rows.extend(open_bins)
    tokens, positions, doc_ids, out_lineage = [], [], [], []
    for row in rows:
        used = 0
        for k, (d, start, n) in enumerate(row):
            tokens.extend(docs[d][start : start + n])
            positions.extend(range(n))
            doc_ids.extend([k] * n)
            dataset, shard, offset, token_start, _ = lineage[d]
            out_lineage.append((dataset, shard, offset, token_start + start, n))
            used += n
        tokens.extend([pad_id] * (length - used))
        positions.extend([0] * (length - used))
        doc_ids.extend([-1] * (length - used))
    return tokens, positions, doc_ids, out_lineage


def median_time(fn, repeats: int) -> tuple[float, object]:
    """Median seconds of ``repeats`` calls (garbage collector off, as in ``timeit``)."""
    times, result = [], None
    gc.collect()
    gc.disable()
    try:
        for _ in range(repeats):
            start = time.perf_counter()
            result = fn()
            times.append(time.perf_counter() - start)
    finally:
        gc.enable()
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small window and fewer repeats")
    args = parser.parse_args()
    n_docs, max_length, repeats = (1024, 2048, 3) if args.quick else (8192, 2048, 7)

    table = synthetic_window(n_docs)
    docs = [
        table.tokens[a:b].tolist()
        for a, b in zip(table.offsets[:-1], table.offsets[1:], strict=True)
    ]
    lineage = [tuple(row) for row in table.lineage.tolist()]
    print(
        f"window: {n_docs} documents, {len(table.tokens):,} tokens, mean length "
        f"{table.lengths.mean():.0f}, max_length {max_length}, median of {repeats} runs"
    )
    print(
        f"{'algorithm':>13} {'numpy tok/s':>14} {'python tok/s':>14} {'speed-up':>9} "
        f"{'efficiency':>11} {'kept':>7} {'cut docs':>9}"
    )
    for algorithm in ALGORITHMS:
        op = Pack(max_length, algorithm)
        ctx = WindowContext(seed=0, lane=0, window=0, dataset_names=("synthetic",))
        fast_s, out = median_time(lambda op=op, ctx=ctx: op.apply(table, ctx), repeats)
        slow_s, ref = median_time(
            lambda algorithm=algorithm: python_pack(docs, lineage, max_length, algorithm),
            3,
        )
        ref_tokens, ref_positions, ref_doc_ids, ref_lineage = ref
        if not (
            out.tokens.tolist() == ref_tokens
            and out.positions.tolist() == ref_positions
            and out.document_ids.tolist() == ref_doc_ids
            and [tuple(r) for r in out.lineage.tolist()] == ref_lineage
        ):
            raise SystemExit(f"{algorithm}: Pack and the pure-Python packer disagree")
        packed = out.num_tokens
        cut = int(np.count_nonzero(np.bincount(out.lineage[:, 2]) > 1))  # in several rows
        print(
            f"{algorithm:>13} {packed / fast_s:>14,.0f} {packed / slow_s:>14,.0f} "
            f"{slow_s / fast_s:>8.1f}x {packed / len(out.tokens):>11.4f} "
            f"{packed / len(table.tokens):>7.4f} {cut:>9}"
        )
    options_and_fields(table, max_length, repeats)


def options_and_fields(table: SampleTable, max_length: int, repeats: int) -> None:
    """Packing tokens/s of ``best_fit`` with each option, and of packing and batch cutting with two
    kept fields against none (one value per document each: an int domain and a float score)."""
    from zephon_dask.consumer.batch import BatchOptions
    from zephon_dask.consumer.cut import cut_batches

    rng = np.random.default_rng(1)
    kept = SampleTable.from_documents(table.tokens, table.offsets, table.lineage, fields={
        "domain": rng.integers(0, 4, len(table)).astype(np.int64), "score": rng.random(len(table)).astype(np.float32)})
    ctx = WindowContext(seed=0, lane=0, window=0, dataset_names=("synthetic",))
    print(f"\n{'best_fit with':>28} {'numpy tok/s':>14} {'efficiency':>11}")
    for label, source, options in (("no option", table, {}), ("two kept fields", kept, {}),
                                   ("groups (4 values)", kept, {"groups": "domain"}),
                                   ("max_sequences_per_bin=4", table, {"max_sequences_per_bin": 4}),
                                   ("shuffle_bins", table, {"shuffle_bins": True})):
        op = Pack(max_length, "best_fit", **options)
        seconds, out = median_time(lambda op=op, source=source: op.apply(source, ctx), repeats)
        print(f"{label:>28} {out.num_tokens / seconds:>14,.0f} {out.num_tokens / len(out.tokens):>11.4f}")
    print(f"\n{'cut and hand out batches of 8':>28} {'tok/s':>14}")
    for label, source, dataset_ids in (("plain", table, False), ("two kept fields", kept, False),
                                       ("kept fields + dataset_ids", kept, True)):
        rows = Pack(max_length, "best_fit").apply(source, ctx)
        opts = BatchOptions(microbatch_size=8, dataset_ids=dataset_ids)

        def cut(rows=rows, opts=opts):
            return [b.arrays() for b in cut_batches(rows, 0, len(rows) // 8, opts, 1)]

        seconds, _ = median_time(cut, repeats)
        print(f"{label:>28} {len(rows) // 8 * 8 * max_length / seconds:>14,.0f}")


if __name__ == "__main__":
    main()
