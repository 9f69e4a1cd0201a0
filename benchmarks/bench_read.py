"""Read throughput per format: records/s of ``Dataset.read`` on one shard at random chunks.

Writes the same documents (fixed seed; ~600 bytes of text each; 100,000 by default) as one shard
in every format zephon_dask reads: JSONL plain, gzip, zstd in one frame and
zstd in frames of 4 MiB of text (``zst frames``); parquet (row
groups of 8,192); Arrow IPC stream (what ``save_to_disk`` writes); MDS raw and
zstd; a litData chunk as ``litdata.optimize`` writes these rows (with its Arrow
footer) and a Lance fragment (``lance.write_dataset``), when those libraries are
installed. Then, per format:

* ``index``: building the Dataset with an empty index cache (counting records;
  for compressed JSONL this decompresses the shard once and records checkpoints);
* ``first chunk``: the first read of a chunk in a fresh process (every
  per-process cache cleared: the line scan or offset table is rebuilt);
* ``chunks``: records/s over ``--reads`` reads of ``--chunk`` consecutive records
  at random offsets (warm process caches, as a Dask worker has them);
* ``uncached``: the same for ``--reads / 10`` chunks with the decoded-data caches
  (compressed JSONL segments, decompressed MDS shards, litData's Arrow footers and
  decompressed chunks) emptied before each read:
  what a chunk costs when nothing decoded is reused (line index and checkpoints kept);
* ``scattered``: records/s over ``--reads / 10`` reads of ``--chunk`` random offsets
  anywhere in the shard (what ``shuffle_within_shard`` with large blocks asks);
* ``check``: what the check that the file is unchanged costs each read (its size,
  mtime and content fingerprint against the index; ``zephon_dask.data.integrity``):
  ``chunks`` again, each chunk read with and without it (the same Dataset with
  its shards' recorded signature set aside) in alternating order, as the ratio
  of the read rates (checked / unchecked: the median unchecked time over itself
  plus the median paired difference), and the check alone in microseconds.

Nothing asserts a time; the figures vary with the machine and its load.

    python benchmarks/bench_read.py [--quick] [--docs N] [--chunk N] [--reads N]
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

from zephon_dask.data import Dataset, compressed, integrity, litdata, mds, memo


def documents(n: int) -> list[dict]:
    rng = np.random.default_rng(0)
    words = np.array(["data", "lane", "window", "shard", "token", "batch", "seed", "dask"])
    lengths = rng.integers(40, 160, size=n)
    return [{"text": " ".join(words[rng.integers(0, 8, size=k)]), "id": i}
            for i, k in enumerate(lengths.tolist())]


def write_mds(folder: Path, docs: list[dict], compression: str | None) -> None:
    """One MDS shard with columns ``id`` (int) and ``text`` (str)."""
    folder.mkdir()
    blobs = [np.uint32(len(d["text"].encode())).tobytes() + np.int64(d["id"]).tobytes()
             + d["text"].encode() for d in docs]
    n = len(blobs)
    starts = 4 * (n + 2) + np.concatenate(([0], np.cumsum([len(b) for b in blobs])))
    data = np.uint32(n).tobytes() + starts.astype(np.uint32).tobytes() + b"".join(blobs)
    raw, zipped = "shard.00000.mds", None
    if compression:
        zipped = raw + ".zstd"
        (folder / zipped).write_bytes(zstandard.ZstdCompressor().compress(data))
    else:
        (folder / raw).write_bytes(data)
    shard = {"column_encodings": ["int", "str"], "column_names": ["id", "text"],
             "column_sizes": [8, None], "compression": compression, "format": "mds",
             "hashes": [], "raw_data": {"basename": raw, "bytes": len(data), "hashes": {}},
             "samples": n, "size_limit": None, "version": 2,
             "zip_data": zipped and {"basename": zipped, "bytes": 0, "hashes": {}}}
    (folder / "index.json").write_text(json.dumps({"version": 2, "shards": [shard]}))


def write_all(root: Path, docs: list[dict]) -> dict[str, Path]:
    text = "".join(json.dumps(d) + "\n" for d in docs).encode()
    table = pa.Table.from_pylist(docs)
    out = {}
    (root / "jsonl").mkdir()
    out["jsonl"] = root / "jsonl" / "a.jsonl"
    out["jsonl"].write_bytes(text)
    out["jsonl.gz"] = root / "a.jsonl.gz"
    out["jsonl.gz"].write_bytes(gzip.compress(text, 6))
    out["jsonl.zst"] = root / "a.jsonl.zst"
    out["jsonl.zst"].write_bytes(zstandard.ZstdCompressor(level=3).compress(text))
    frames = [text[i : i + (4 << 20)] for i in range(0, len(text), 4 << 20)]
    out["zst frames"] = root / "b.jsonl.zst"  # 4 MiB of text per frame: seekable per frame
    out["zst frames"].write_bytes(b"".join(zstandard.ZstdCompressor(level=3).compress(f)
                                           for f in frames))
    out["parquet"] = root / "a.parquet"
    pq.write_table(table, out["parquet"], row_group_size=8192)
    out["arrow"] = root / "a.arrow"
    with pa.OSFile(str(out["arrow"]), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        for batch in table.to_batches(max_chunksize=1000):
            w.write_batch(batch)
    for name, comp in (("mds", None), ("mds.zst", "zstd")):
        write_mds(root / name.replace(".", "_"), docs, comp)
        out[name] = root / name.replace(".", "_")
    try:
        import litdata as lit

        lit.optimize(fn=_same, inputs=docs, output_dir=str(root / "litdata"), chunk_bytes="4GB",
                     num_workers=1)
        out["litdata"] = root / "litdata"
    except ImportError:
        print("litdata is not installed: no litdata line")
    try:
        import lance as pylance

        pylance.write_dataset(table, str(root / "a.lance"), max_rows_per_file=len(docs))
        out["lance"] = root / "a.lance"
    except ImportError:
        print("pylance is not installed: no lance line")
    return out


def _same(doc: dict) -> dict:
    return doc


def clear() -> None:
    """Every per-process read cache emptied: a fresh Dask worker."""
    memo.clear_all()


def bench(label: str, path: Path, chunk: int, reads: int, rng) -> dict:
    clear()
    t0 = time.perf_counter()
    ds = Dataset.from_path("b", path, progress=False)
    index_s = time.perf_counter() - t0
    n = ds.num_samples
    clear()
    start = int(rng.integers(0, n - chunk))
    t0 = time.perf_counter()
    ds.read(0, np.arange(start, start + chunk))
    first_s = time.perf_counter() - t0
    starts = rng.integers(0, n - chunk, size=reads)
    t0 = time.perf_counter()
    for s in starts.tolist():
        ds.read(0, np.arange(s, s + chunk))
    chunks_s = time.perf_counter() - t0
    few = max(5, reads // 10)
    starts = rng.integers(0, n - chunk, size=few)
    elapsed = 0.0
    for s in starts.tolist():
        compressed.SEGMENTS.clear()  # decoded data dropped; line index and checkpoints kept
        mds.DECODED.clear()
        litdata.DECODED.clear()
        litdata.TABLES.clear()
        t0 = time.perf_counter()
        ds.read(0, np.arange(s, s + chunk))
        elapsed += time.perf_counter() - t0
    uncached = chunk * few / elapsed
    scattered = [rng.integers(0, n, size=chunk) for _ in range(few)]
    t0 = time.perf_counter()
    for offs in scattered:
        ds.read(0, offs)
    scattered_s = time.perf_counter() - t0
    size = sum(p.stat().st_size for p in ([path] if path.is_file() else path.rglob("*")) if p.is_file())
    ratio, check_us = check_cost(ds, chunk, reads, rng)
    return {"format": label, "MiB": size / 2**20, "index_s": index_s, "first_ms": first_s * 1e3,
            "chunks": chunk * reads / chunks_s, "uncached": uncached,
            "scattered": chunk * len(scattered) / scattered_s, "ratio": ratio, "check_us": check_us}


def unchecked(ds: Dataset) -> Dataset:
    """``ds`` with its shards' signatures set aside: ``Dataset.read`` then checks nothing."""
    shards = tuple(dataclasses.replace(s, mtime_ns=None, etag=None, fingerprint=None) for s in ds.shards)
    return dataclasses.replace(ds, shards=shards)


def check_cost(ds: Dataset, chunk: int, reads: int, rng) -> tuple[float, float]:
    """``(checked / unchecked chunk read rate, microseconds per check)``: each chunk read with
    and without the check, in alternating order; the rate ratio from the median unchecked time
    and the median of the paired differences (paired, so the machine's load cancels out)."""
    bare = unchecked(ds)
    n = ds.num_samples
    plain, extra = [], []
    for k, s in enumerate(rng.integers(0, n - chunk, size=reads).tolist()):
        took = {}
        for checked in ((True, False) if k % 2 else (False, True)):
            t0 = time.perf_counter()
            (ds if checked else bare).read(0, np.arange(s, s + chunk))
            took[checked] = time.perf_counter() - t0
        plain.append(took[False])
        extra.append(took[True] - took[False])
    t0 = time.perf_counter()
    for _ in range(reads):
        integrity.verify(ds.shards[0], ds.storage_options, ds.name)
    base = float(np.median(plain))
    return base / (base + float(np.median(extra))), (time.perf_counter() - t0) / reads * 1e6


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="20,000 documents, 50 reads")
    ap.add_argument("--docs", type=int, default=100_000)
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--reads", type=int, default=200)
    args = ap.parse_args(argv)
    docs_n, reads = (20_000, 50) if args.quick else (args.docs, args.reads)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["ZEPHON_DASK_CACHE_DIR"] = os.path.join(tmp, "cache")  # a cold index cache
        root = Path(tmp) / "data"
        root.mkdir()
        paths = write_all(root, documents(docs_n))
        print(f"{docs_n:,} documents, chunks of {args.chunk}, {reads} chunk reads, "
              f"{max(5, reads // 10)} scattered reads\n")
        print(f"{'format':<11}{'MiB':>8}{'index s':>9}{'first ms':>10}"
              f"{'chunks rec/s':>14}{'uncached rec/s':>16}{'scattered rec/s':>17}"
              f"{'checked/unchecked':>19}{'check us':>10}")
        rng = np.random.default_rng(1)
        for label, path in paths.items():
            r = bench(label, path, args.chunk, reads, rng)
            print(f"{r['format']:<11}{r['MiB']:>8.1f}{r['index_s']:>9.2f}{r['first_ms']:>10.1f}"
                  f"{r['chunks']:>14,.0f}{r['uncached']:>16,.0f}{r['scattered']:>17,.0f}"
                  f"{r['ratio']:>19.3f}{r['check_us']:>10.0f}", flush=True)


if __name__ == "__main__":
    main()
