"""What integrity on read costs: a token shard's first open (chunk listing, offsets checks and
offsets sha256 against the completion record) against a bare zarr open, and ``verify_store``'s
full hash of every token.

    python benchmarks/bench_verify.py [--tokens 20000000] [--docs 100000] [--quick]
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import tempfile
import time

import numpy as np
import zarr

from zephon_dask.data import tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=20_000_000)
    ap.add_argument("--docs", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="2M tokens, 10k documents")
    args = ap.parse_args()
    if args.quick:
        args.tokens, args.docs = 2_000_000, 10_000
    rng = np.random.default_rng(0)
    cuts = np.sort(rng.choice(np.arange(1, args.tokens), args.docs - 1, replace=False))
    flat = rng.integers(0, 50_000, args.tokens, dtype=np.uint16)
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/store"
        tokens.write_token_store(path, {"a": np.split(flat, cuts)})
        off = zarr.open_array(f"{path}/shards/a/offsets", mode="r")[:]
        group = zarr.open_group(f"{path}/shards/a", mode="r+")
        group.attrs.update({tokens.RECORD: {
            "num_docs": args.docs, "num_tokens": args.tokens,
            "offsets_sha256": hashlib.sha256(off.astype("<i8").tobytes()).hexdigest(),
            "tokens_sha256": hashlib.sha256(flat.astype("<u2").tobytes()).hexdigest()}})
        (shard,), _ = tokens.open_store(path, None)

        def checked():
            tokens.OPENED.clear()
            tokens._open(shard, None)

        def bare():
            zarr.open_array(f"{shard.path}/tokens", mode="r")
            zarr.open_array(f"{shard.path}/offsets", mode="r")[:]

        def timed(fn):
            runs = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                fn()
                runs.append(time.perf_counter() - t0)
            return statistics.median(runs)

        t_bare, t_checked = timed(bare), timed(checked)
        t0 = time.perf_counter()
        tokens.OPENED.clear()
        tokens.verify_store(path)
        t_full = time.perf_counter() - t0
        chunks = -(-args.tokens // tokens.TOKEN_CHUNK)
        print(f"shard: {args.tokens:,} tokens in {chunks} chunks, {args.docs:,} documents")
        print(f"first open, bare zarr: {t_bare * 1e3:.1f} ms; with the checks: {t_checked * 1e3:.1f} ms "
              f"(+{(t_checked - t_bare) * 1e3:.1f} ms once per shard and process)")
        print(f"verify_store (hash every token): {t_full:.2f} s, "
              f"{args.tokens * 2 / t_full / 1e6:.0f} MB/s of uint16 tokens")


if __name__ == "__main__":
    main()
