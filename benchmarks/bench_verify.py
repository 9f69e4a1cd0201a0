"""What integrity on read costs: a token shard's first open (chunk listing, offsets checks and
offsets sha256 against the completion record) against a bare zarr open, ``verify_store``'s
full hash of every token, and the vocabulary check on every read (reads of 256 random
documents, as a window does, with and without ``vocab_size``).

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
        (shard,) = tokens.open_store(path, None).shards

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

        picks = [np.sort(rng.choice(args.docs, 256, replace=False)) for _ in range(40)]

        def reads(vocab):
            return lambda: [tokens.read(shard, p, storage_options=None, vocab_size=vocab) for p in picks]

        reads(None)()  # warm: the shard is open and its chunks in the page cache
        t_plain, t_vocab = timed(reads(None)), timed(reads(50_257))
        n = sum(int(np.diff(off)[p].sum()) for p in picks)
        print(f"reads of 256 documents ({n / len(picks):,.0f} tokens each): {t_plain / len(picks) * 1e3:.2f} ms "
              f"unchecked, {t_vocab / len(picks) * 1e3:.2f} ms with the vocabulary check "
              f"({(t_vocab - t_plain) / t_plain:+.1%})")
        flats = [np.concatenate([r["tokens"] for r in recs]) for recs in reads(None)()]
        t_max = timed(lambda: [int(f.max()) >= 50_257 for f in flats])
        print(f"the check alone (one max over the ids read): {t_max / len(picks) * 1e6:.0f} us per read "
              f"({t_max / t_plain:.3%} of a read)")


if __name__ == "__main__":
    main()
