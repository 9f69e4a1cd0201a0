"""Data in object storage: what a node fetches per format, and tokens/s local against S3.

Starts a real S3-protocol server on 127.0.0.1 (moto's server, ``moto[server]``,
reached through ``s3fs``) with a counting, fault-injecting proxy in front of it
(``tests/helpers/s3server.py``), writes the documents of ``bench_read.py`` (fixed seed)
in every format into a bucket, and reports:

* **bytes fetched per byte of records used**, per format: ``--reads`` reads of
  ``--chunk`` consecutive records at random offsets in a fresh process (every
  per-process read cache empty, as a new Dask worker has them), counted as the
  response body bytes that passed the proxy, over the bytes those records take in
  the object (object size x records read / records in it). ``index`` is what
  building the Dataset fetched (once per run, on the machine that builds it),
  ``first read`` what the first chunk of a fresh process on that node fetched,
  ``other node`` the same on a node without the cache directory (a plain JSONL
  object's line spans are kept there at indexing; elsewhere each process scans
  the object once), ``per chunk`` the later chunks.
* **tokens/s** of a pipeline (bytes tokenizer, packing, batches; in-process
  ``synchronous`` runner, so the time is the reading) over the JSONL corpus, in
  ``--rounds`` alternated rounds after a first pass of each (a long-lived worker:
  the line spans known and, the object being no larger than 64 MiB, its blocks
  kept in the process): on local disk; in the bucket without the node cache
  (reads served by the kept blocks ask the store whether the ETag stands at
  most once a second); the same with the process's blocks dropped before the
  pass (every block fetched again, as for an object larger than 64 MiB or a
  fresh worker); with the node cache warm (``storage_options["node_cache"]``,
  filled once before the rounds: its reads send no request); and through a
  proxy answering 10% of the requests 503 SlowDown and resetting 10% mid-body,
  blocks dropped before the pass. Each pass counts the GETs and HEADs that
  reached the store; batches are checked equal to the local ones (their sha256
  is printed). Then the ratios that matter, each from passes of the same round:
  without the node cache / local (blocks kept, and fetched again), node cache
  warm / local, faults / fault-free with blocks fetched again in both (median
  and range over the rounds), the peak RSS of a fresh process indexing and
  reading the object from S3 (one reader, as a Dask worker), and that of this
  process, which holds every pass's dataset and client at once.

Nothing asserts a time. ``--quick`` uses 20,000 documents.

    python benchmarks/bench_remote.py [--quick] [--docs N] [--chunk N] [--reads N] [--steps N]
                                      [--rounds N] [--tokens-only]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import resource
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository: tests.helpers

from bench_read import documents, write_all  # noqa: E402

import zephon_dask as z  # noqa: E402
from tests.helpers.s3server import FaultProxy, S3Server  # noqa: E402
from zephon_dask.data import (  # noqa: E402
    Dataset,
    memo,
    remote,
    write_token_store,
)
from zephon_dask.data.index import CACHE_ENV  # noqa: E402


def clear() -> None:
    """Every per-process read cache emptied: a fresh Dask worker."""
    memo.clear_all()


def object_size(fs, url: str) -> int:
    path = url.removeprefix("s3://")
    return sum(fs.du(path, total=False).values()) if fs.isdir(path) else fs.size(path)


def fetched(proxy: FaultProxy, fn) -> tuple[int, object]:
    proxy.reset_counts()
    out = fn()
    return proxy.body_bytes, out


def bytes_table(server: S3Server, proxy: FaultProxy, paths: dict[str, str], chunk: int, reads: int) -> None:
    fs = server.filesystem()
    opts = server.options(endpoint=proxy.url)
    print(f"bytes fetched per byte of records used ({reads} reads of {chunk} consecutive records, "
          "fresh process)")
    print(f"{'format':<12} {'object MiB':>10} {'index MiB':>10} {'first read':>11} {'other node':>11} "
          f"{'per chunk':>10}")
    rng = np.random.default_rng(0)
    for label, url in paths.items():
        clear()
        shutil.rmtree(os.path.join(os.environ[CACHE_ENV], "index"), ignore_errors=True)
        index_b, ds = fetched(proxy, lambda u=url: Dataset.from_path("b", u, storage_options=opts,
                                                                      progress=False))
        clear()
        n = ds.num_samples
        size = object_size(fs, url)
        per_record = size / n
        starts = rng.integers(0, n - chunk, size=reads)
        first_b, _ = fetched(proxy, lambda d=ds, s=starts: d.read(0, np.arange(s[0], s[0] + chunk)))
        clear()
        shutil.rmtree(os.path.join(os.environ[CACHE_ENV], "spans"), ignore_errors=True)
        other_b, _ = fetched(proxy, lambda d=ds, s=starts: d.read(0, np.arange(s[0], s[0] + chunk)))
        rest_b, _ = fetched(proxy, lambda d=ds, s=starts: [d.read(0, np.arange(a, a + chunk))
                                                           for a in s[1:]])
        used = per_record * chunk
        print(f"{label:<12} {size / 2**20:>10.1f} {index_b / 2**20:>10.1f} {first_b / used:>10.1f}x "
              f"{other_b / used:>10.1f}x {rest_b / (used * (reads - 1)):>9.2f}x")


def reset_peak() -> None:
    """Start the process's peak RSS afresh (Linux: ``/proc/self/clear_refs``; elsewhere it stays)."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass


def rss_mib(field: str = "VmHWM") -> float:
    """The process's peak RSS (``VmHWM``: since :func:`reset_peak`, else since its start) or its RSS
    now (``VmRSS``), in MiB; Linux, else the peak since the start."""
    try:
        with open("/proc/self/status") as fh:
            return next(int(line.split()[1]) for line in fh if line.startswith(f"{field}:")) / 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def pipeline(ds: Dataset):
    ws = z.MixtureWorkSource([ds], chunk_size=64, seed=1)
    return (z.Pipeline(ws).tokenize().pack(1024).batch(8)
            .options(canonical_replicas=4, flush_every_k_chunks=4, runner="synchronous"))


def stream(p, steps: int) -> tuple[float, int, str]:
    """``(seconds, tokens, sha256 of the batches' tokens in order)`` of ``steps`` batches of ``p``."""
    t0 = time.perf_counter()
    ntok, digest = 0, hashlib.sha256()
    with p:
        for _, b in zip(range(steps), p, strict=False):
            ntok += int(b["lengths"].sum())
            digest.update(b["tokens"].tobytes())
    return time.perf_counter() - t0, ntok, digest.hexdigest()


def tokens_table(server: S3Server, local: str, steps: int, rounds: int) -> None:
    """tokens/s local against S3 in alternated rounds, and the ratios of each round."""
    print(f"\ntokens/s of the pipeline over JSONL ({steps} batches a pass, synchronous runner, after a "
          f"first pass of each), {rounds} alternated rounds")
    url = "s3://bench/jsonl/a.jsonl"
    with (FaultProxy(server.url) as clean, FaultProxy(server.url, slowdown=0.10, reset=0.10, seed=2) as faulty,
          tempfile.TemporaryDirectory() as node):
        shutil.rmtree(os.path.join(os.environ[CACHE_ENV], "index"), ignore_errors=True)
        plain = Dataset.from_jsonl("web", url, storage_options=server.options(endpoint=clean.url), progress=False)
        faults = Dataset.from_jsonl("web", url, storage_options=server.options(endpoint=faulty.url), progress=False)
        sets = {  # label -> (dataset, its proxy, whether the pass starts with the process's blocks dropped)
            "local disk": (Dataset.from_jsonl("web", local, progress=False), None, False),
            "S3, no node cache": (plain, clean, False),
            "S3, no cache, fresh blocks": (plain, clean, True),
            "S3, node cache warm": (Dataset.from_jsonl("web", url, storage_options=server.options(
                endpoint=clean.url, node_cache={"dir": node, "max_bytes": 1 << 34}), progress=False), clean, False),
            "S3, 10% 503 + 10% resets": (faults, faulty, True),
        }
        clear()
        _, _, want = stream(pipeline(sets["local disk"][0]), steps)
        print(f"sha256 of the local batches: {want[:16]} (every pass below is checked equal)")
        for ds, _, _ in sets.values():  # each layout known to this process, the node cache filled
            stream(pipeline(ds), steps)
        rates: dict[str, list[float]] = {k: [] for k in sets}
        print(f"{'round':<6} {'data':<27} {'tok/s':>11} {'GET':>6} {'HEAD':>5} {'faults':>7}")
        for r in range(rounds):
            order = list(sets) if r % 2 == 0 else list(sets)[::-1]
            for label in order:
                ds, proxy, fresh = sets[label]
                if fresh:
                    remote.BLOCKS.clear()
                if proxy is not None:
                    proxy.reset_counts()
                s, n, got = stream(pipeline(ds), steps)
                assert got == want, f"{label}: batches differ from the local ones"
                rates[label].append(n / s)
                counts = ("", "", "") if proxy is None else (
                    proxy.methods["GET"], proxy.methods["HEAD"], sum(proxy.faults.values()))
                print(f"{r + 1:<6} {label:<27} {n / s:>11,.0f} {counts[0]:>6} {counts[1]:>5} {counts[2]:>7}")
    local_r = np.array(rates["local disk"])
    fresh_r = np.array(rates["S3, no cache, fresh blocks"])
    ratios = {
        "S3 without the node cache / local disk (goal >= 0.5x)": np.array(rates["S3, no node cache"]) / local_r,
        "S3 without the node cache, blocks fetched again / local disk": fresh_r / local_r,
        "S3 with the node cache warm / local disk (goal >= 0.95x)": np.array(rates["S3, node cache warm"]) / local_r,
        "S3 with 10% 503 + 10% resets / fault-free S3, blocks fetched again in both (goal >= 0.5x)":
            np.array(rates["S3, 10% 503 + 10% resets"]) / fresh_r,
    }
    print("\nratios, each from the same round (median, range over the rounds):")
    for what, v in ratios.items():
        print(f"  {what}: {np.median(v):.3f}x ({v.min():.3f}-{v.max():.3f})")


def reader_peak(url: str, options: dict, steps: int, cache: str) -> float:
    """The peak RSS (MiB) of this process (a fresh one) indexing ``url`` and streaming ``steps``
    batches of it twice: one reader's memory, as a Dask worker's would be."""
    os.environ[CACHE_ENV] = cache
    ds = Dataset.from_jsonl("web", url, storage_options=options, progress=False)
    for _ in range(2):
        stream(pipeline(ds), steps)
    return rss_mib()


def write_corpus(root: Path, n: int, tokens_only: bool) -> dict[str, Path]:
    """The ``n`` documents written under ``root``: the JSONL file alone, or every format and a
    token store (run in a process of its own, so the reading process never holds them)."""
    docs = documents(n)
    if tokens_only:
        (root / "jsonl").mkdir()
        written = {"jsonl": root / "jsonl" / "a.jsonl"}
        written["jsonl"].write_bytes("".join(json.dumps(d) + "\n" for d in docs).encode())
        return written
    written = write_all(root, docs)
    rng = np.random.default_rng(1)
    write_token_store(str(root / "tok"), {"s0": [rng.integers(0, 256, len(d["text"])).astype(
        np.uint16) for d in docs]}, vocab_size=256)
    return written


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--docs", type=int, default=100_000)
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--reads", type=int, default=50)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens-only", action="store_true", help="skip the bytes-per-format table")
    args = ap.parse_args()
    n = 20_000 if args.quick else args.docs
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory() as ours, S3Server() as server, FaultProxy(server.url) as proxy:
        os.environ[CACHE_ENV] = ours  # the node's cache directory (index, kept line spans)
        root = Path(tmp)
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            written = pool.submit(write_corpus, root, n, args.tokens_only).result()  # never held here
        fs = server.filesystem()
        fs.mkdir("bench")
        fs.put(str(root) + "/", "bench/", recursive=True)
        paths = {label: "s3://bench/" + str(p.relative_to(root)) for label, p in written.items()}
        paths["tokens"] = "s3://bench/tok"
        print(f"{n:,} documents; S3 server {server.url} (moto), counted at a proxy on 127.0.0.1")
        if not args.tokens_only:
            bytes_table(server, proxy, paths, args.chunk, args.reads)
        reset_peak()
        before = rss_mib("VmRSS")
        tokens_table(server, str(written["jsonl"]), args.steps, args.rounds)
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            one = pool.submit(reader_peak, "s3://bench/jsonl/a.jsonl", server.options(), args.steps,
                              os.environ[CACHE_ENV]).result()
        print(f"peak RSS of a fresh process indexing the JSONL object and reading it twice from S3 "
              f"(no node cache): {one:,.0f} MiB")
        print(f"peak RSS of this process while it indexed and read (the five passes' datasets and clients at "
              f"once): {rss_mib():,.0f} MiB, from "
              f"{before:,.0f} MiB before (the S3 server runs in a process of its own)")


if __name__ == "__main__":
    main()
