"""What identity by content costs: the whole-file digest a local shard's index records, and the
re-check of a shard whose mtime alone moved (``touch``, ``cp``, ``rsync`` without ``-t``).

Writes one JSONL and one parquet shard of ``--mib`` MiB (the same documents), then, per format:

* ``index s``: building the Dataset with an empty index cache (the median of ``--repeat``);
* ``digest s``: the whole-file SHA-256 alone, the part of ``index s`` identity by content adds
  (a JSONL index scans the file anyway; a parquet index otherwise reads only its footer);
* ``re-check s``: the first read of a record after the file was touched (the file hashed whole,
  compared with the recorded digest), and ``read s`` a read after it (the verdict kept);
* ``GiB/s``: the re-check's rate, and ``s/GiB`` its inverse.

The file was just written, so it is read from the page cache: the figures are the hash's CPU
cost; from a cold disk the re-check also waits for the disk to read the file once. Nothing
asserts a time.

    python benchmarks/bench_identity.py [--mib 256] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from zephon_dask.data import Dataset, integrity


def write(folder: Path, mib: int) -> dict[str, Path]:
    """A JSONL and a parquet file holding the same documents, the JSONL ``mib`` MiB."""
    rng = np.random.default_rng(0)
    words = np.array(["data", "lane", "window", "shard", "token", "batch", "seed", "dask"])
    text = [" ".join(words[rng.integers(0, 8, size=100)]) for _ in range(1000)]
    line = [json.dumps({"text": t}) + "\n" for t in text]
    per_block = sum(len(x) for x in line)
    with open(folder / "a.jsonl", "w") as fh:
        for _ in range(mib * 2**20 // per_block):
            fh.writelines(line)
    n = mib * 2**20 // per_block * len(text)
    pq.write_table(pa.table({"text": (text * (n // len(text)))}), folder / "a.parquet",
                   compression="none", use_dictionary=False, row_group_size=8192)
    return {"jsonl": folder / "a.jsonl", "parquet": folder / "a.parquet"}


def timed(fn, *args, **kwargs):
    """(seconds, result) of ``fn(*args, **kwargs)``."""
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return time.perf_counter() - t0, out


def touch(path: Path) -> None:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))


def measure(path: Path, cache: str) -> tuple[float, float, float, float]:
    """Index ``path`` with an empty cache, hash it alone, touch it, read it twice: the seconds."""
    index, ds = timed(Dataset.from_path, "d", str(path), progress=False, cache_dir=cache)
    alone, _ = timed(integrity.local_digest, str(path), integrity.local(str(path)))
    touch(path)
    check, _ = timed(ds.read, 0, [0])
    read, _ = timed(ds.read, 0, [1])
    return index, alone, check, read


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(f"{'format':8} {'MiB':>6} {'index s':>8} {'digest s':>9} {'re-check s':>11} {'read s':>8} "
          f"{'GiB/s':>6} {'s/GiB':>6}")
    with tempfile.TemporaryDirectory() as tmp:
        files = write(Path(tmp), args.mib)
        for fmt, path in files.items():
            size = path.stat().st_size
            runs = [measure(path, f"{tmp}/cache-{fmt}-{r}") for r in range(args.repeat)]
            index, alone, check, read = zip(*runs, strict=True)
            m = statistics.median
            rate = size / 2**30 / m(check)
            print(f"{fmt:8} {size / 2**20:6.0f} {m(index):8.3f} {m(alone):9.3f} {m(check):11.3f} "
                  f"{m(read):8.4f} {rate:6.2f} {1 / rate:6.2f}")


if __name__ == "__main__":
    main()
