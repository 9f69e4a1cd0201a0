"""How close a mixture weighted by tokens lands to its target, on the benchmark corpus.

Builds ``bench_e2e.py``'s corpus and tokenizer (fixed seed; lognormal document
lengths, median ~280 words), splits its documents by length into two datasets,
``short`` (under 150 words) and ``long`` (over 600), about ten times apart in
tokens per document, and runs one full pass (``stop_after_passes=1``) of

    MixtureWorkSource([short, long], {"short": 0.3, "long": 0.7}, weight_by=...)
    -> tokenize(BPE) -> pack(2048) -> batch(8), canonical_replicas=8

for each ``--weight-by`` asked. It prints the measured tokens per sample, the
time the measurement took, and per dataset the targets and the realized shares
of samples and of real tokens from ``stats()``. Information only: nothing asserts.

    python benchmarks/bench_token_mix.py [--quick] [--weight-by samples|tokens|both] [--workers N]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bench_e2e import train_tokenizer, write_corpus  # noqa: E402

from zephon_dask import Dataset, MixtureWorkSource, Pipeline  # noqa: E402

WEIGHTS = {"short": 0.3, "long": 0.7}
SHORT_WORDS, LONG_WORDS = 150, 600


def split_by_length(corpus: str, out: str) -> dict[str, int]:
    """``out/short/*.jsonl`` and ``out/long/*.jsonl`` from the corpus shards; documents per dataset."""
    counts = {"short": 0, "long": 0}
    for name in counts:
        os.makedirs(os.path.join(out, name), exist_ok=True)
    for shard in sorted(os.listdir(corpus)):
        if not shard.endswith(".jsonl"):
            continue
        with open(os.path.join(corpus, shard), encoding="utf-8") as f, \
                open(os.path.join(out, "short", shard), "w", encoding="utf-8") as short, \
                open(os.path.join(out, "long", shard), "w", encoding="utf-8") as long:
            for line in f:
                words = len(json.loads(line)["text"].split())
                if words < SHORT_WORDS:
                    short.write(line)
                    counts["short"] += 1
                elif words > LONG_WORDS:
                    long.write(line)
                    counts["long"] += 1
    return counts


def one_pass(root: str, tokenizer: str, weight_by: str, workers: int) -> dict:
    datasets = [Dataset.from_jsonl(name, os.path.join(root, name), progress=False) for name in WEIGHTS]
    source = MixtureWorkSource(datasets, WEIGHTS, chunk_size=64, seed=0, weight_by=weight_by)
    pipe = (Pipeline(source).tokenize(tokenizer).pack(2048).batch(8)
            .options(canonical_replicas=8, flush_every_k_chunks=4, runner="threads", n_workers=workers))
    t0 = time.perf_counter()
    measured = pipe.spec.source  # weight_by="tokens": the measurement happens here, once
    measure_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in pipe:
        pass
    stats = pipe.stats()
    pipe.close()
    return {"weight_by": weight_by, "measure_s": measure_s, "pass_s": time.perf_counter() - t0,
            "tokens_per_sample": measured.tokens_per_sample, "mixture": stats.mixture, "tokens": stats.tokens}


def report(result: dict) -> None:
    print(f"\nweight_by={result['weight_by']!r}: one full pass, {result['tokens']:,} real tokens "
          f"in {result['pass_s']:.1f} s")
    if result["tokens_per_sample"] is not None:
        tps = ", ".join(f"{n} {float(t):,.1f}" for n, t in zip(WEIGHTS, result["tokens_per_sample"], strict=True))
        print(f"  tokens per sample (measured in {result['measure_s'] * 1000:.0f} ms): {tps}")
    print(f"  {'dataset':8} {'sample target':>13} {'sample share':>12} {'token target':>12} {'token share':>11}"
          f" {'token error':>11}")
    for m, target in zip(result["mixture"], WEIGHTS.values(), strict=True):
        token_target = "n/a" if m["token_target"] is None else f"{m['token_target']:.3f}"
        error = (m["token_share"] - target) * 100
        print(f"  {m['dataset']:8} {m['sample_target']:>13.3f} {m['sample_share']:>12.3f} {token_target:>12}"
              f" {m['token_share']:>11.3f} {error:>+10.2f}pp")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="~8 MB corpus instead of ~40 MB")
    ap.add_argument("--weight-by", choices=("samples", "tokens", "both"), default="both")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="threads computing windows")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "corpus")
        os.makedirs(corpus)
        info = write_corpus(corpus, (8 if args.quick else 40) * 2**20, None)
        tokenizer = os.path.join(tmp, "tokenizer.json")
        train_tokenizer(corpus, tokenizer)
        counts = split_by_length(corpus, os.path.join(tmp, "mix"))
        print(f"corpus: {info['docs']:,} documents, {info['bytes'] / 2**20:.1f} MB; "
              f"short (< {SHORT_WORDS} words): {counts['short']:,}, long (> {LONG_WORDS} words): {counts['long']:,}")
        print(f"target token shares: {WEIGHTS}")
        modes = ("samples", "tokens") if args.weight_by == "both" else (args.weight_by,)
        for mode in modes:
            report(one_pass(os.path.join(tmp, "mix"), tokenizer, mode, args.workers))


if __name__ == "__main__":
    main()
