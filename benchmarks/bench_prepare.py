"""Throughput of ``prepare_tokens`` against the tokenizer itself, and of pipelines over its store.

Builds the JSONL corpus and byte-level BPE tokenizer of ``bench_e2e.py`` (fixed
seed, 8 shards, vocab 4096), then, in one run:

* ``tokenizer, 1 thread``: ``encode_batch`` of the Hugging Face tokenizer over
  every document, in this process, texts already in memory (the ceiling one
  core can reach);
* ``shard tasks in a loop``: ``tokenize_shard`` (read + tokenize + write +
  verify, prepare's own task) for every shard in this process, no Dask;
* ``prepare, N workers``: ``prepare_tokens`` on an embedded ``LocalCluster`` of
  N worker processes (one thread each), timed with and without starting the
  cluster (its start includes the workers importing zephon_dask);
* ``rerun, verify only``: ``prepare_tokens`` again on the finished store
  (every shard verified by checksum, nothing written);
* ``pipeline from raw text`` / ``from the token store``: ``compute_window``
  over every window of ``MixtureWorkSource([ds]).tokenize(tok).pack(2048)``
  and of the same pipeline over the store without ``.tokenize``, in this
  process; the packed tokens must be identical (sha256 printed).

Every process tokenizes with one thread. With ``--repeat N`` every mode runs
N times (prepare into a fresh store each time) and the fastest run is shown,
which damps the noise of a shared machine. Nothing asserts a time.

    python benchmarks/bench_prepare.py [--quick] [--docs N] [--repeat N]
"""

from __future__ import annotations

import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAYON_NUM_THREADS", "1")

import argparse  # noqa: E402
import hashlib  # noqa: E402
import importlib  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from zephon_dask import (  # noqa: E402
    Dataset,
    MixtureWorkSource,
    Pipeline,
    Tokenize,
    compute_window,
    prepare_tokens,
)
from zephon_dask.jobs.prepare import store_shard_ids, token_dtype, tokenize_shard  # noqa: E402

SEQ_LEN = 2048
CHUNK_SIZE = 64
REPLICAS = 8
FLUSH_K = 4


def baseline_tokenizer(ds: Dataset, tok_path: str) -> dict:
    """Single-thread ``encode_batch`` over every document; the texts are read beforehand."""
    op = Tokenize(tok_path)
    texts = [r["text"] for s, shard in enumerate(ds.shards)
             for r in ds.read(s, np.arange(shard.num_samples))]
    t0 = time.perf_counter()
    tokens = 0
    for lo in range(0, len(texts), 8192):
        tokens += sum(len(a) for a in op.tokenizer.encode_batch(texts[lo:lo + 8192]))
    wall = time.perf_counter() - t0
    return {"wall": wall, "tokens": tokens + len(texts), "docs": len(texts)}  # + one EOS per doc


def shard_loop(ds: Dataset, tok_path: str, out: str) -> dict:
    """prepare's own shard task, for every shard in turn in this process (no Dask, no store root)."""
    op = Tokenize(tok_path)
    dtype = token_dtype(op).name
    t0 = time.perf_counter()
    tokens = 0
    for i, (sid, shard) in enumerate(zip(store_shard_ids(ds.num_shards), ds.shards, strict=True)):
        source = {"shard_id": shard.shard_id, "num_samples": shard.num_samples,
                  "size_bytes": shard.size_bytes, "mtime": shard.mtime}
        tokens += tokenize_shard(ds, op, dtype, None, i, f"{out}/shards/{sid}", source)["num_tokens"]
    return {"wall": time.perf_counter() - t0, "tokens": tokens}


def prepare_with(ds: Dataset, tok_path: str, out: str, workers: int) -> dict:
    from zephon_dask.execution.connect import connect

    t0 = time.perf_counter()
    with connect(n_workers=workers) as client:
        client.wait_for_workers(workers)
        client.run(importlib.import_module, "zephon_dask.jobs.prepare")
        t1 = time.perf_counter()
        report = prepare_tokens(ds, Tokenize(tok_path), out, client=client, progress=False)
        t2 = time.perf_counter()
        again = prepare_tokens(ds, Tokenize(tok_path), out, client=client, progress=False)
        t3 = time.perf_counter()
    assert again.computed == () and len(again.reused) == ds.num_shards
    return {"start": t1 - t0, "wall": t2 - t1, "verify": t3 - t2, "tokens": report.num_tokens,
            "store": report.dataset}


def pipeline_pass(ds: Dataset, tok_path: str | None) -> dict:
    """Every window of the packing pipeline, in this process; real packed tokens and their sha256."""
    p = Pipeline(MixtureWorkSource([ds], chunk_size=CHUNK_SIZE, seed=0))
    if tok_path is not None:
        p = p.tokenize(tok_path)
    spec = p.pack(SEQ_LEN).options(canonical_replicas=REPLICAS, flush_every_k_chunks=FLUSH_K).spec
    sha, tokens = hashlib.sha256(), 0
    t0 = time.perf_counter()
    for lane in range(REPLICAS):
        for w in range(spec.num_windows(lane)):
            out = compute_window(spec, lane, w)
            tokens += out.stats["pack.tokens"]
            sha.update(np.ascontiguousarray(out.table.tokens).tobytes())
    return {"wall": time.perf_counter() - t0, "tokens": tokens, "sha": sha.hexdigest()}


def fastest(run, repeat: int) -> dict:
    """The run with the smallest wall time among ``repeat`` calls of ``run(i)``."""
    return min((run(i) for i in range(repeat)), key=lambda r: r["wall"])


def _rate(tokens: int, wall: float) -> str:
    return f"{tokens / wall / 1e6:8.2f} M"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="~8 MB corpus instead of ~40 MB")
    ap.add_argument("--docs", type=int, default=None, help="cap the corpus at N documents")
    ap.add_argument("--repeat", type=int, default=1, help="runs per mode; the fastest is shown")
    args = ap.parse_args(argv)
    # bench_e2e imports torch: only this process imports it, never the spawned Dask workers
    from bench_e2e import SHARDS, VOCAB, _cpu_snapshot, _foreign_cpu, train_tokenizer, write_corpus

    target = (8 if args.quick else 40) * 1_000_000
    with tempfile.TemporaryDirectory(prefix="zephon-bench-prepare-") as tmp:
        data = os.path.join(tmp, "data")
        os.makedirs(data)
        corpus = write_corpus(data, target, args.docs)
        tok_path = os.path.join(tmp, "tokenizer.json")
        train_tokenizer(data, tok_path)
        ds = Dataset.from_jsonl("corpus", data, progress=False)
        print(f"corpus: {corpus['docs']:,} documents, {corpus['bytes'] / 1e6:.1f} MB in {SHARDS} "
              f"shards; BPE tokenizer vocab {VOCAB}; {os.cpu_count()} cores; fastest of "
              f"{args.repeat} run(s) per mode", flush=True)
        cpu0, wall0 = _cpu_snapshot(), time.perf_counter()
        n = args.repeat
        base = fastest(lambda i: baseline_tokenizer(ds, tok_path), n)
        loop = fastest(lambda i: shard_loop(ds, tok_path, os.path.join(tmp, f"loop-{i}")), n)
        runs = {k: fastest(lambda i, k=k: prepare_with(ds, tok_path, os.path.join(tmp, f"store-{k}-{i}"), k), n)
                for k in (1, 2)}
        raw = fastest(lambda i: pipeline_pass(ds, tok_path), n)
        stored = fastest(lambda i: pipeline_pass(runs[2]["store"], None), n)
        foreign = _foreign_cpu(cpu0, _cpu_snapshot())
        timed = time.perf_counter() - wall0

    ref = base["tokens"] / base["wall"]
    rows = [("tokenizer encode_batch, 1 thread", base["wall"], base["tokens"]),
            ("shard tasks in a loop, 1 process", loop["wall"], loop["tokens"])]
    for k, r in runs.items():
        rows += [(f"prepare, {k} worker(s), incl. cluster start", r["start"] + r["wall"], r["tokens"]),
                 (f"prepare, {k} worker(s), excl. cluster start", r["wall"], r["tokens"]),
                 (f"rerun, verify only, {k} worker(s)", r["verify"], r["tokens"])]
    print()
    print(f"{'mode':44s} {'wall s':>7s} {'tokens/s':>10s} {'vs tokenizer':>12s}")
    for name, wall, tokens in rows:
        print(f"{name:44s} {wall:7.2f} {_rate(tokens, wall)} {tokens / wall / ref:11.2f}x")
    print(f"({base['tokens']:,} tokens; cluster start: 1 worker {runs[1]['start']:.2f} s, "
          f"2 workers {runs[2]['start']:.2f} s)")
    print()
    print(f"{'pipeline .pack(2048), 1 process':44s} {'wall s':>7s} {'packed/s':>10s} {'ratio':>12s}")
    for name, r in (("from raw text (.tokenize in the pipeline)", raw), ("from the token store", stored)):
        print(f"{name:44s} {r['wall']:7.2f} {_rate(r['tokens'], r['wall'])} "
              f"{(r['tokens'] / r['wall']) / (raw['tokens'] / raw['wall']):11.2f}x")
    same = raw["sha"] == stored["sha"]
    print(f"packed tokens identical: {'YES' if same else 'NO'} [{raw['sha'][:16]}, {raw['tokens']:,} tokens]")
    if foreign is not None:
        share = foreign / (timed * (os.cpu_count() or 1))
        print(f"CPU used by other processes during the timed runs: {foreign:.1f} s ({share:.0%} of the "
              "machine)" + ("  -> timings are noisy; rerun on a quiet machine" if share > 0.05 else ""))


if __name__ == "__main__":
    main()
