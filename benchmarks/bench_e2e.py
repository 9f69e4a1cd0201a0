"""End-to-end throughput of the pipeline against plain-Python baselines, in one run.

Generates a JSONL corpus (fixed seed, several shards, documents of varied
length built from a synthetic word list), trains a small byte-level BPE
tokenizer on a slice of it, then does the same work (read + tokenize +
``pack(2048)`` + ``batch(8)``, ``canonical_replicas=8``) four ways:

* ``1-process loop``: ``compute_window`` over every (lane, window) in this
  process, batches cut with the library's ``LaneBatcher`` in the pipeline's
  round-robin order;
* ``process pool``: the same windows computed by a
  ``ProcessPoolExecutor(max_workers=os.cpu_count())`` (the spec reaches each
  worker once, through the initializer), batches cut here;
* ``pipeline, cold``: the pipeline on its embedded Dask ``LocalCluster``
  (default runner, ``n_workers`` = cores), iterated to the end in a separate
  "training process" that imports torch first; the wall time includes
  starting the cluster;
* ``pipeline, warm``: another iteration over the same, already started
  cluster.

The pool and the warm pipeline are timed ``--repeat`` times, alternately (pool,
pipeline, pool, pipeline, ...), so both see the same machine; the table shows
medians and the per-round ratios. Every mode hashes the ``tokens`` array of every batch (sha256, in delivery
order); the pipeline's hashes must equal the 1-process loop's. The targets
printed next to the figures are information only: nothing asserts a time.

    python benchmarks/bench_e2e.py [--quick] [--docs N] [--workers N] [--repeat N]
"""

from __future__ import annotations

import os

# One tokenizer thread per process everywhere (this process, pool workers, Dask
# workers): the 1-process baseline then really uses one core, and the all-cores
# modes do not oversubscribe the machine. Set before ``tokenizers`` is imported.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAYON_NUM_THREADS", "1")

import argparse  # noqa: E402
import concurrent.futures as cf  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402, F401  (a training process has torch loaded: it counts in peak RSS)

from zephon_dask import Dataset, MixtureWorkSource, Pipeline, compute_window  # noqa: E402
from zephon_dask.consumer.batcher import LaneBatcher  # noqa: E402

SEQ_LEN = 2048
MICROBATCH = 8
REPLICAS = 8
VOCAB = 4096
SHARDS = 8
CHUNK_SIZE = 64  # documents per chunk
FLUSH_K = 4  # chunks per window: ~256 documents, ~0.5 MB of text, >= ~100 ms per window
TARGET_VS_POOL = 0.95
TARGET_FIRST_BATCH_S = 3.0
TARGET_RSS_MB = 450.0
CHILD_FLAG = "--_pipeline-child"


# -- corpus and tokenizer ---------------------------------------------------------------


def make_words(rng: np.random.Generator, n: int = 20_000) -> tuple[np.ndarray, np.ndarray]:
    """A synthetic word list (syllable words) and Zipf-like frequencies."""
    syllables = [c + v for c in "bcdfghjklmnprstvwz" for v in ("a", "e", "i", "o", "u", "ai", "ou")]
    syl = np.array(syllables, dtype=object)
    words = set()
    while len(words) < n:
        k = int(rng.integers(1, 5))
        words.add("".join(syl[rng.integers(0, len(syl), k)]))
    words = sorted(words)
    rng.shuffle(words)
    # punctuation attached to a few frequent forms gives sentence-like text
    extra = [w + p for w in words[:200] for p in (",", ".")]
    vocab = np.array(words + extra + ["the", "of", "and", "to", "in", "a", "is"], dtype=object)
    freq = 1.0 / np.arange(1, len(vocab) + 1) ** 1.05
    rng.shuffle(freq)
    freq[-7:] = freq.max() * 2  # the function words are the most frequent
    return vocab, freq / freq.sum()


def write_corpus(root: str, target_bytes: int, max_docs: int | None, seed: int = 0) -> dict:
    """Shards ``shard-XX.jsonl`` under ``root``; document lengths are lognormal (median ~280 words)."""
    rng = np.random.default_rng(seed)
    vocab, p = make_words(rng)
    files = [open(os.path.join(root, f"shard-{s:02d}.jsonl"), "w", encoding="utf-8") for s in range(SHARDS)]
    written = docs = words_total = 0
    try:
        while written < target_bytes and (max_docs is None or docs < max_docs):
            n = 2000
            lengths = np.clip(rng.lognormal(np.log(280), 0.9, n).round().astype(np.int64), 5, 20_000)
            idx = rng.choice(len(vocab), size=int(lengths.sum()), p=p)
            words = vocab[idx].tolist()
            start = 0
            for length in lengths.tolist():
                text = " ".join(words[start:start + length])
                start += length
                line = json.dumps({"id": docs, "text": text}) + "\n"
                files[docs % SHARDS].write(line)
                written += len(line)
                docs += 1
                words_total += length
                if written >= target_bytes or (max_docs is not None and docs >= max_docs):
                    break
    finally:
        for f in files:
            f.close()
    return {"docs": docs, "bytes": written, "words": words_total}


def train_tokenizer(root: str, out_path: str, sample_bytes: int = 2_000_000) -> None:
    """Byte-level BPE (vocab ~4k) trained on the first ``sample_bytes`` of shard 0."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    texts, size = [], 0
    with open(os.path.join(root, "shard-00.jsonl"), encoding="utf-8") as f:
        for line in f:
            texts.append(json.loads(line)["text"])
            size += len(texts[-1])
            if size >= sample_bytes:
                break
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.save(out_path)


def build_pipeline(data_dir: str, tokenizer_path: str, workers: int) -> Pipeline:
    ds = Dataset.from_jsonl("corpus", data_dir, progress=False)
    source = MixtureWorkSource([ds], chunk_size=CHUNK_SIZE, seed=0)
    return (
        Pipeline(source)
        .tokenize(tokenizer_path)
        .pack(SEQ_LEN)
        .batch(MICROBATCH)
        .options(n_workers=workers, canonical_replicas=REPLICAS, flush_every_k_chunks=FLUSH_K)
    )


# -- batch accounting ---------------------------------------------------------------------


class Tally:
    """Real tokens, batch count and the running sha256 of every batch's ``tokens`` array."""

    def __init__(self):
        self.sha = hashlib.sha256()
        self.batches = self.tokens = 0

    def add(self, batch) -> None:
        tokens = np.ascontiguousarray(batch["tokens"])
        self.sha.update(str(tokens.shape).encode())
        self.sha.update(tokens.tobytes())
        self.tokens += int(np.count_nonzero(batch["document_ids"] >= 0))
        self.batches += 1

    def digest(self) -> str:
        return self.sha.hexdigest()


def round_robin(spec, batch_options, get_window):
    """Batches in the pipeline's order: strict round-robin over lanes, finished lanes skipped.

    ``get_window(lane)`` returns the lane's next ``WindowOutput`` or ``None`` past its end.
    """
    lanes = list(range(spec.canonical_replicas))
    batchers = {lane: LaneBatcher(lane, batch_options, spec.source.names) for lane in lanes}
    live = list(lanes)
    while live:
        for lane in list(live):
            b = batchers[lane]
            while not b.ready():
                out = get_window(lane)
                if out is None:
                    break
                b.push(out.window, out.table)
            if b.ready():
                yield b.pop()
            else:
                last = b.finish()
                live.remove(lane)
                if last is not None:
                    yield last


def all_windows(spec) -> list[tuple[int, int]]:
    """Every (lane, window), window by window and lane by lane (the order they are needed)."""
    counts = {lane: spec.num_windows(lane) for lane in range(spec.canonical_replicas)}
    return [(lane, w) for w in range(max(counts.values())) for lane in counts if w < counts[lane]]


# -- baselines ------------------------------------------------------------------------------


def run_single(pipe: Pipeline) -> dict:
    spec, opts = pipe.spec, pipe.batch_options
    tally = Tally()
    t0 = time.perf_counter()
    nxt = dict.fromkeys(range(spec.canonical_replicas), 0)
    counts = {lane: spec.num_windows(lane) for lane in nxt}

    def get(lane):
        w = nxt[lane]
        if w >= counts[lane]:
            return None
        nxt[lane] = w + 1
        return compute_window(spec, lane, w)

    first = None
    for batch in round_robin(spec, opts, get):
        if first is None:
            first = time.perf_counter() - t0
        tally.add(batch)
    wall = time.perf_counter() - t0
    return {"wall": wall, "first": first, "tokens": tally.tokens, "batches": tally.batches,
            "sha": tally.digest()}


_WORKER_SPEC = None


def _pool_init(spec) -> None:
    global _WORKER_SPEC
    _WORKER_SPEC = spec


def _pool_window(pair):
    return compute_window(_WORKER_SPEC, *pair)


def _pool_ready(_):
    time.sleep(0.05)  # keep each worker busy long enough that every worker gets started
    return os.getpid()


def run_pool(pipe: Pipeline, workers: int) -> dict:
    """All windows on a process pool (results come back pickled, batches cut here)."""
    spec, opts = pipe.spec, pipe.batch_options
    pairs = all_windows(spec)
    tally = Tally()
    t0 = time.perf_counter()
    with cf.ProcessPoolExecutor(max_workers=workers, initializer=_pool_init, initargs=(spec,)) as pool:
        pids = set(pool.map(_pool_ready, range(workers)))  # start every worker (timed separately)
        cpu0 = _cpu(pids)
        t_ready = time.perf_counter()
        results = pool.map(_pool_window, pairs)
        got: dict = {}
        nxt = dict.fromkeys(range(spec.canonical_replicas), 0)
        remaining = set(pairs)

        def get(lane):
            key = (lane, nxt[lane])
            if key not in remaining:
                return None
            while key not in got:
                out = next(results)
                got[(out.lane, out.window)] = out
            nxt[lane] += 1
            remaining.discard(key)
            return got.pop(key)

        first = None
        for batch in round_robin(spec, opts, get):
            if first is None:
                first = time.perf_counter() - t0
            tally.add(batch)
        t_end = time.perf_counter()
        cpu = _cpu(pids) - cpu0
    return {"wall": t_end - t0, "wall_warm": t_end - t_ready, "start": t_ready - t0, "first": first,
            "tokens": tally.tokens, "batches": tally.batches, "sha": tally.digest(), "cpu": cpu}


# -- the pipeline, in its own "training process" --------------------------------------------


def _rss_mb() -> float:
    """Peak RSS of this process in MB: ``getrusage(RUSAGE_SELF).ru_maxrss``.

    On Linux, ``ru_maxrss`` survives ``exec``: a child starts with its parent's RSS at the fork as
    its floor (this benchmark's parent holds torch and the baselines). ``VmHWM`` in
    ``/proc/self/status`` is the same high-water mark for the current process image only, so it
    is used where it exists.
    """
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return min(maxrss, int(line.split()[1]) / 1024)
    except OSError:
        pass
    return maxrss


def _cpu(pids=None) -> float:
    """CPU seconds of this process and of ``pids`` (default: every live descendant)."""
    import psutil

    total = 0.0
    me = psutil.Process()
    others = me.children(recursive=True) if pids is None else [psutil.Process(p) for p in pids]
    for proc in [me, *others]:
        try:
            t = proc.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def _timed_pass(pipe: Pipeline) -> dict:
    tally = Tally()
    cpu0 = _cpu()
    t0 = time.perf_counter()
    it = iter(pipe)  # starts the cluster on first use and submits the first windows
    t_iter = time.perf_counter()
    first = None
    for batch in it:
        if first is None:
            first = time.perf_counter() - t0
        tally.add(batch)
    t_end = time.perf_counter()
    return {"wall": t_end - t0, "start": t_iter - t0, "first": first, "tokens": tally.tokens,
            "cpu": _cpu() - cpu0,
            "batches": tally.batches, "sha": tally.digest(),
            "packing": pipe.stats().packing_efficiency}


def pipeline_child(args) -> None:
    """Runs in a fresh interpreter: the cold pass, then a warm pass per ``warm`` line on stdin;
    ``quit`` closes the pipeline and reports the peak RSS. One JSON line per answer."""
    rss_imports = _rss_mb()
    pipe = build_pipeline(args.data, args.tokenizer, args.workers)
    try:
        cold = _timed_pass(pipe)
        runner = pipe.runner()
        print(json.dumps({"cold": cold, "rss_imports_mb": rss_imports, "runner": runner.describe(),
                          "worker_pids": sorted(runner.worker_pids().values())}), flush=True)
        for line in sys.stdin:
            if line.strip() != "warm":
                break
            print(json.dumps(_timed_pass(pipe)), flush=True)
    finally:
        pipe.close()
    print(json.dumps({"rss_peak_mb": _rss_mb()}), flush=True)


class PipelineProcess:
    """The pipeline's training process, driven one pass at a time (so passes interleave with the pool's)."""

    def __init__(self, data_dir: str, tokenizer_path: str, workers: int):
        cmd = [sys.executable, os.path.abspath(__file__), CHILD_FLAG, "--data", data_dir,
               "--tokenizer", tokenizer_path, "--workers", str(workers)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.result = self._answer()  # the cold pass
        self.result["warm"] = []

    def _answer(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            raise SystemExit(f"the pipeline process failed (exit {self.proc.returncode})")
        return json.loads(line)

    def warm(self) -> dict:
        self.proc.stdin.write("warm\n")
        self.proc.stdin.flush()
        self.result["warm"].append(self._answer())
        return self.result["warm"][-1]

    def finish(self) -> dict:
        self.proc.stdin.write("quit\n")
        self.proc.stdin.flush()
        self.result.update(self._answer())
        self.proc.wait(timeout=60)
        time.sleep(0.5)
        self.result["leftover_pids"] = [pid for pid in self.result["worker_pids"] if _alive(pid)]
        return self.result


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _cpu_snapshot() -> tuple[float, float] | None:
    """(busy CPU seconds of the whole machine, CPU seconds of this process and its reaped children)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    busy = (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")  # minus idle, iowait
    own = sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
              for f in ("ru_utime", "ru_stime"))
    return busy, own


def _foreign_cpu(before, after) -> float | None:
    """CPU seconds other processes used between two snapshots (noise indicator)."""
    if before is None or after is None:
        return None
    return max(0.0, (after[0] - before[0]) - (after[1] - before[1]))


# -- report -----------------------------------------------------------------------------------


def _fmt_rate(x: float) -> str:
    return f"{x / 1e6:8.2f} M"


def _median_pass(passes: list[dict]) -> dict:
    """The pass of median wall time (an actual pass, so its figures belong together)."""
    return sorted(passes, key=lambda p: p["wall"])[(len(passes) - 1) // 2]


def report(info: dict, single: dict, pools: list[dict], pipe: dict, workers: int) -> None:
    total = single["tokens"]
    cold, warms = pipe["cold"], pipe["warm"]
    pool, warm = _median_pass(pools), _median_pass(warms)
    pool_rate, pool_rate_warm = total / pool["wall"], total / pool["wall_warm"]
    single_rate = total / single["wall"]
    n = len(pools)
    rows = [
        ("1-process loop", single["wall"], single_rate, single["first"], None),
        (f"process pool x{workers} (incl. start)", pool["wall"], pool_rate, pool["first"], None),
        (f"process pool x{workers} (excl. start)", pool["wall_warm"], pool_rate_warm, None, None),
        ("pipeline, cold (incl. cluster start)", cold["wall"], cold["tokens"] / cold["wall"],
         cold["first"], pipe["rss_peak_mb"]),
        ("pipeline, cold (excl. cluster start)", cold["wall"] - cold["start"],
         cold["tokens"] / (cold["wall"] - cold["start"]), None, None),
        ("pipeline, warm cluster", warm["wall"], warm["tokens"] / warm["wall"], warm["first"], None),
    ]
    print()
    print(f"pool and warm pipeline: medians of {n} alternating passes; 1-process loop and cold pipeline: one pass")
    print(f"{'mode':40s} {'wall s':>7s} {'tokens/s':>10s} {'vs pool':>8s} {'vs 1-proc':>9s} "
          f"{'1st batch':>9s} {'peak RSS':>9s}")
    for name, wall, rate, first, rss in rows:
        # like with like: start-up-free rates against the pool's start-up-free rate
        ref = pool_rate if "incl." in name or name.startswith("1-process") else pool_rate_warm
        first_s = f"{first:8.2f}s" if first is not None else f"{'':9s}"
        rss_s = f"{rss:6.0f} MB" if rss is not None else ""
        print(f"{name:40s} {wall:7.2f} {_fmt_rate(rate)} {rate / ref:7.2f}x {rate / single_rate:8.2f}x "
              f"{first_s} {rss_s}")
    rounds = [p["wall_warm"] / w["wall"] for p, w in zip(pools, warms, strict=True)]
    print()
    print("warm pipeline / pool (excl. start), round by round: "
          + ", ".join(f"{r:.2f}x" for r in rounds))
    print(f"CPU per pass (medians; all processes of the mode): pool {statistics.median(p['cpu'] for p in pools):.1f} s, "
          f"warm pipeline {statistics.median(w['cpu'] for w in warms):.1f} s (Dask workers and the training "
          "process, which hosts the scheduler)")
    print(f"cluster start (iter() returning, cold): {cold['start']:.2f} s; pool start: {pool['start']:.2f} s")
    print(f"training process RSS: {pipe['rss_imports_mb']:.0f} MB after imports (torch included), "
          f"{pipe['rss_peak_mb']:.0f} MB peak")
    shas = {single["sha"], cold["sha"], *(p["sha"] for p in pools), *(w["sha"] for w in warms)}
    print(f"batches byte-identical to the 1-process loop (sha256 of all tokens arrays) in all "
          f"{2 + 2 * n} passes: {'YES' if len(shas) == 1 else 'NO'}  [{single['sha'][:16]}, "
          f"{single['batches']} batches, {total:,} real tokens]")
    if pipe["leftover_pids"]:
        print(f"WARNING: Dask worker processes still alive after close(): {pipe['leftover_pids']}")
    else:
        print(f"processes left behind after close(): none ({len(pipe['worker_pids'])} workers checked)")
    foreign = info["foreign_cpu"]
    if foreign is not None:
        share = foreign / (info["timed_wall"] * (os.cpu_count() or 1))
        print(f"CPU used by other processes during the timed runs: {foreign:.1f} s ({share:.0%} of the machine)"
              + ("  -> timings are noisy; rerun on a quiet machine" if share > 0.05 else ""))
    print()
    ratio_cold = (cold["tokens"] / cold["wall"]) / pool_rate
    ratio_warm = (warm["tokens"] / warm["wall"]) / pool_rate_warm
    print("targets (information only, never asserted):")
    print(f"  tokens/s >= {TARGET_VS_POOL:.2f}x the all-cores pool: warm {ratio_warm:.2f}x (median pass; "
          f"median of the rounds {statistics.median(rounds):.2f}x), cold {ratio_cold:.2f}x incl. cluster start")
    print(f"  first batch <= {TARGET_FIRST_BATCH_S:.0f} s: cold {cold['first']:.2f} s, warm {warm['first']:.2f} s")
    print(f"  peak RSS <= {TARGET_RSS_MB:.0f} MB: {pipe['rss_peak_mb']:.0f} MB")
    if cold["packing"] is not None:
        print(f"  (packing efficiency {cold['packing']:.3f}; "
              f"{info['windows']} windows of ~{info['docs_per_window']} documents)")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="~8 MB corpus instead of ~40 MB")
    ap.add_argument("--docs", type=int, default=None, help="cap the corpus at N documents")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                    help="pool processes and Dask workers (default: all cores)")
    ap.add_argument("--repeat", type=int, default=5,
                    help="alternating pool / warm pipeline passes (default 5; medians are shown)")
    ap.add_argument(CHILD_FLAG, dest="child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--tokenizer", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        pipeline_child(args)
        return
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")

    target = (8 if args.quick else 40) * 1_000_000
    with tempfile.TemporaryDirectory(prefix="zephon-bench-e2e-") as tmp:
        data_dir = os.path.join(tmp, "data")
        os.makedirs(data_dir)
        t = time.perf_counter()
        corpus = write_corpus(data_dir, target, args.docs)
        t_corpus = time.perf_counter() - t
        tok_path = os.path.join(tmp, "tokenizer.json")
        t = time.perf_counter()
        train_tokenizer(data_dir, tok_path)
        t_tok = time.perf_counter() - t
        pipe = build_pipeline(data_dir, tok_path, args.workers)
        spec = pipe.spec
        windows = all_windows(spec)
        print(f"corpus: {corpus['docs']:,} documents, {corpus['bytes'] / 1e6:.1f} MB in {SHARDS} shards "
              f"(mean {corpus['words'] / corpus['docs']:.0f} words/doc), written in {t_corpus:.1f} s; "
              f"BPE tokenizer (vocab {VOCAB}) trained in {t_tok:.1f} s")
        print(f"work: tokenize + pack({SEQ_LEN}) + batch({MICROBATCH}); {REPLICAS} lanes, "
              f"chunk_size={CHUNK_SIZE}, flush_every_k_chunks={FLUSH_K} -> {len(windows)} windows; "
              f"{args.workers} workers on {os.cpu_count()} cores")
        cpu0, wall0 = _cpu_snapshot(), time.perf_counter()
        single = run_single(pipe)
        print(f"1-process loop done: {single['wall']:.2f} s "
              f"({single['wall'] / len(windows) * 1000:.0f} ms per window)", flush=True)
        child = PipelineProcess(data_dir, tok_path, args.workers)
        print(f"pipeline cold pass done: {child.result['cold']['wall']:.2f} s [{child.result['runner']}]",
              flush=True)
        pools = []
        for i in range(args.repeat):
            pools.append(run_pool(pipe, args.workers))
            warm = child.warm()
            print(f"round {i + 1}/{args.repeat}: pool {pools[-1]['wall_warm']:.2f} s, "
                  f"warm pipeline {warm['wall']:.2f} s", flush=True)
        result = child.finish()
        info = {"windows": len(windows), "docs_per_window": CHUNK_SIZE * FLUSH_K}
        info["foreign_cpu"] = _foreign_cpu(cpu0, _cpu_snapshot())
        info["timed_wall"] = time.perf_counter() - wall0
        report(info, single, pools, result, args.workers)


if __name__ == "__main__":
    main()
