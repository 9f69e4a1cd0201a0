"""End-to-end throughput of the pipeline against plain-Python baselines, in one run.

For each workload (``prose``: JSONL prose, BPE 4096, 4 chunks per window;
``mixed``: prose plus Python source, BPE 8192, BOS/EOS, ``shuffle(1024)``, 8
chunks per window), generates the corpus (fixed seed), trains a byte-level BPE
tokenizer on a slice of it, then does the same work (read + tokenize + ...
+ ``pack(2048)`` + ``batch(8)``, ``canonical_replicas=8``) four ways:

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
* ``pipeline, first pass after the cold one``: one pass, left out of the
  ratios. The head start may compute the whole cold pass in the training
  process, so the workers' first tasks (importing the library, loading the
  spec, ~0.7 s of CPU each) fall in this pass; the pool's workers do that
  in its start-up, before their passes are timed;
* ``pipeline, warm``: another iteration over the same, already started
  cluster.

The pool and the warm pipeline are timed ``--repeat`` times, alternately (pool,
pipeline, pool, pipeline, ...), so both see the same machine; the table shows
medians and the per-round ratios. The cold first batch is also timed in fresh
training processes for 1 to ``--workers`` workers, and a training loop with a
fixed CPU step runs in steady state fed from memory (the pipeline idle) and
from one continuing iteration of the pipeline (``cores - 1`` workers),
alternately. Every mode hashes the ``tokens`` array of every batch (sha256, in
delivery order); the pipeline's hashes must equal the 1-process loop's. The
targets printed next to the figures are information only: nothing asserts a
time.

    python benchmarks/bench_e2e.py [--workload prose|mixed|all] [--quick] [--docs N] [--workers N]
                                   [--repeat N] [--first-repeat N] [--train-steps N] [--train-rounds N]
                                   [--no-head-start] [--windows-per-task N]
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
import glob  # noqa: E402
import hashlib  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402, F401  (a training process has torch loaded: it counts in peak RSS)

from zephon_dask import Dataset, MixtureWorkSource, Pipeline, compute_window  # noqa: E402
from zephon_dask.consumer.batcher import LaneBatcher  # noqa: E402

if __name__ != "__main__":
    # Imported by another benchmark: the probes this module runs on Dask workers (_worker_threads,
    # _executed) reach them by value, as from a script. By reference, each worker would import this
    # module, torch with it (~2.5 s of CPU a worker, counted as the workers' event loops).
    import cloudpickle  # noqa: E402

    cloudpickle.register_pickle_by_value(sys.modules[__name__])

SEQ_LEN = 2048
MICROBATCH = 8
REPLICAS = 8
SHARDS = 8
CHUNK_SIZE = 64  # documents per chunk
TARGET_VS_POOL = 1.0
TARGET_CPU_VS_POOL = 1.05  # the pipeline's CPU per token (every process) against the pool's
TARGET_FIRST_BATCH_S = 1.0
TARGET_RSS_MB = 450.0
TARGET_CPU_PER_M = 0.05  # training-process CPU seconds per million delivered tokens
TARGET_STEP_SLOWDOWN = 0.03
TRAIN_STEPS = 200
TRAIN_ROUNDS = 7
CHILD_FLAG = "--_pipeline-child"


@dataclass(frozen=True)
class Workload:
    """One benchmark workload: the corpus, the tokenizer and the pipeline's settings."""

    name: str
    prose_mb: float  # full size; --quick takes a fifth
    code_mb: float  # Python source (the interpreter's standard library, repeated as needed)
    vocab: int
    flush_k: int  # chunks per window
    bos: bool
    shuffle: int | None

    def describe(self) -> str:
        extra = (", BOS/EOS" if self.bos else "") + (f", shuffle({self.shuffle})" if self.shuffle else "")
        return (f"{self.name}: byte-level BPE {self.vocab}{extra}, pack({SEQ_LEN}) wrap, batch({MICROBATCH}), "
                f"R={REPLICAS}, chunk_size={CHUNK_SIZE}, {self.flush_k} chunks per window")


WORKLOADS = {
    # ~256 documents, ~0.5 MB of text, >= ~100 ms per window
    "prose": Workload("prose", 40, 0, 4096, 4, False, None),
    # larger windows (~512 documents), two datasets, a shuffle: ~13.7 M tokens per pass in full
    "mixed": Workload("mixed", 36, 22, 8192, 8, True, 1024),
}


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


def write_code(root: str, target_bytes: int) -> dict:
    """Shards ``shard-XX.jsonl`` of Python source: the standard library's files in sorted order
    (tests included), each cut into blocks of 200 lines, repeated until ``target_bytes``."""
    import sysconfig

    lib = sysconfig.get_paths()["stdlib"]
    paths = [p for p in sorted(glob.glob(os.path.join(lib, "**", "*.py"), recursive=True))
             if "site-packages" not in p]
    files = [open(os.path.join(root, f"shard-{s:02d}.jsonl"), "w", encoding="utf-8") for s in range(SHARDS)]
    written = docs = 0
    try:
        while written < target_bytes:
            for path in paths:
                with open(path, encoding="utf-8", errors="replace") as f:
                    lines = f.readlines()
                for start in range(0, len(lines), 200):
                    line = json.dumps({"id": docs, "text": "".join(lines[start:start + 200])}) + "\n"
                    files[docs % SHARDS].write(line)
                    written += len(line)
                    docs += 1
                if written >= target_bytes:
                    break
    finally:
        for f in files:
            f.close()
    return {"docs": docs, "bytes": written}


def train_tokenizer(roots: list[str], out_path: str, vocab: int, sample_bytes: int = 2_000_000) -> None:
    """Byte-level BPE (``vocab`` ids) trained on the first ``sample_bytes`` of each root's shard 0."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    texts = []
    for root in roots:
        size = 0
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
        vocab_size=vocab, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.save(out_path)


def make_data(tmp: str, wl: Workload, quick: bool, max_docs: int | None) -> tuple[str, str]:
    """Write the workload's corpus under ``tmp`` and train its tokenizer: ``(tokenizer path, summary)``."""
    scale = 0.2 if quick else 1.0
    roots, parts = [], []
    t = time.perf_counter()
    prose = os.path.join(tmp, "prose")
    os.makedirs(prose)
    c = write_corpus(prose, int(wl.prose_mb * scale * 1e6), max_docs)
    roots.append(prose)
    parts.append(f"{c['docs']:,} prose documents, {c['bytes'] / 1e6:.1f} MB (mean {c['words'] / c['docs']:.0f} words)")
    if wl.code_mb:
        code = os.path.join(tmp, "code")
        os.makedirs(code)
        c = write_code(code, int(wl.code_mb * scale * 1e6))
        roots.append(code)
        parts.append(f"{c['docs']:,} Python source blocks, {c['bytes'] / 1e6:.1f} MB")
    t_corpus = time.perf_counter() - t
    tok_path = os.path.join(tmp, "tokenizer.json")
    t = time.perf_counter()
    train_tokenizer(roots, tok_path, wl.vocab)
    summary = (f"corpus: {'; '.join(parts)}, {SHARDS} shards each, written in {t_corpus:.1f} s; "
               f"tokenizer trained in {time.perf_counter() - t:.1f} s")
    return tok_path, summary


def build_pipeline(wl: Workload, data_dir: str, tokenizer_path: str, workers: int, passes: int = 1) -> Pipeline:
    """The workload's pipeline; ``passes`` over the corpus (``stop_after_passes``) make a longer stream."""
    datasets = [Dataset.from_jsonl("prose", os.path.join(data_dir, "prose"), progress=False)]
    if wl.code_mb:
        datasets.append(Dataset.from_jsonl("code", os.path.join(data_dir, "code"), progress=False))
    source = MixtureWorkSource(datasets, chunk_size=CHUNK_SIZE, seed=0, stop_after_passes=passes)
    pipe = Pipeline(source).tokenize(
        tokenizer_path, bos=wl.bos, eos=True, bos_id="<|endoftext|>" if wl.bos else None)
    if wl.shuffle:
        pipe = pipe.shuffle(wl.shuffle)
    return (
        pipe.pack(SEQ_LEN)
        .batch(MICROBATCH)
        .options(n_workers=workers, canonical_replicas=REPLICAS, flush_every_k_chunks=wl.flush_k)
    )


# -- batch accounting ---------------------------------------------------------------------


class Tally:
    """Real tokens, batch count and the running sha256 of every batch's ``tokens`` array."""

    def __init__(self):
        self.sha = hashlib.sha256()
        self.batches = self.tokens = 0
        self.cpu = 0.0  # CPU seconds spent here (the benchmark's own, not the pipeline's)

    def add(self, batch) -> None:
        t = time.thread_time()
        tokens = np.ascontiguousarray(batch["tokens"])
        self.sha.update(str(tokens.shape).encode())
        self.sha.update(tokens.tobytes())
        self.tokens += int(np.count_nonzero(batch["document_ids"] >= 0))
        self.batches += 1
        self.cpu += time.thread_time() - t

    def digest(self) -> str:
        return self.sha.hexdigest()


def round_robin(spec, batch_options, get_window, per_lane: int = 1):
    """Batches in the pipeline's order: strict round-robin over lanes, finished lanes skipped; with
    ``drop_last_step`` (the spec's), whole global steps of ``per_lane`` batches of every lane only,
    ending before the first step a lane cannot complete.

    ``get_window(lane)`` returns the lane's next ``WindowOutput`` or ``None`` past its end.
    """
    lanes = list(range(spec.canonical_replicas))
    batchers = {lane: LaneBatcher(lane, batch_options, spec.source.names) for lane in lanes}

    def fill(lane: int, batches: int) -> bool:
        b = batchers[lane]
        while b.buffered < batches * batch_options.microbatch_size:
            out = get_window(lane)
            if out is None:
                return False
            b.push(out.window, out.table)
        return True

    if spec.drop_last_step:
        while all(fill(lane, per_lane) for lane in lanes):
            for _ in range(per_lane):
                for lane in lanes:
                    yield batchers[lane].pop()
        return
    live = list(lanes)
    while live:
        for lane in list(live):
            b = batchers[lane]
            if fill(lane, 1):
                yield b.pop()
            else:
                last = b.finish()
                live.remove(lane)
                if last is not None:
                    yield last


def per_lane(pipe: Pipeline) -> int:
    """Batches of each lane in one of ``pipe``'s global steps."""
    return pipe.session.step_shape().global_batches // pipe.spec.canonical_replicas


def all_windows(spec) -> list[tuple[int, int]]:
    """Every (lane, window), window by window and lane by lane (the order they are needed)."""
    counts = {lane: spec.num_windows(lane) for lane in range(spec.canonical_replicas)}
    return [(lane, w) for w in range(max(counts.values())) for lane in counts if w < counts[lane]]


# -- baselines ------------------------------------------------------------------------------


def run_single(pipe: Pipeline, limit: int | None = None) -> dict:
    """Every batch (the first ``limit`` only, if given) computed in this process, in delivery order."""
    spec, opts = pipe.spec, pipe.description.batch
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
    for batch in itertools.islice(round_robin(spec, opts, get, per_lane(pipe)), limit):
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
    spec, opts = pipe.spec, pipe.description.batch
    pairs = all_windows(spec)
    tally = Tally()
    t0 = time.perf_counter()
    with cf.ProcessPoolExecutor(max_workers=workers, initializer=_pool_init, initargs=(spec,)) as pool:
        pids = set(pool.map(_pool_ready, range(workers)))  # start every worker (timed separately)
        cpu0, parent0 = _cpu(pids), _self_cpu()
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
        for batch in round_robin(spec, opts, get, per_lane(pipe)):
            if first is None:
                first = time.perf_counter() - t0
            tally.add(batch)
        t_end = time.perf_counter()
        cpu, parent = _cpu(pids) - cpu0, _self_cpu() - parent0
    return {"wall": t_end - t0, "wall_warm": t_end - t_ready, "start": t_ready - t0, "first": first,
            "tokens": tally.tokens, "batches": tally.batches, "sha": tally.digest(), "cpu": cpu,
            "cpu_parts": {"parent": parent, "workers": cpu - parent}}


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


def _thread_cpu() -> dict[str, float]:
    """CPU seconds of this process's threads, grouped by role: ``main`` (the training loop:
    waiting for windows, cutting batches), ``event loop`` (Dask's IO loop: scheduler, client and
    nannies when they live here, receiving windows), ``offload`` (Dask's deserialisation
    thread), ``other``."""
    import threading

    import psutil

    names = {t.native_id: t.name for t in threading.enumerate()}
    main_id = threading.main_thread().native_id
    out: dict[str, float] = {}
    for t in psutil.Process().threads():
        name = names.get(t.id, "")
        role = ("main" if t.id == main_id else "event loop" if "IO loop" in name or "IOLoop" in name
                else "offload" if "Offload" in name else "other")
        out[role] = out.get(role, 0.0) + t.user_time + t.system_time
    return out


def _worker_threads() -> dict[str, float]:
    """CPU seconds of a Dask worker process's threads by role (run on each worker): ``tasks`` (the
    thread running the tasks), ``event loop`` (its main thread: messages, data transfers,
    heartbeats, memory checks), ``other`` (the profiler's and the offload threads)."""
    import threading

    import psutil

    names = {t.native_id: t.name for t in threading.enumerate()}
    main_id = threading.main_thread().native_id
    out: dict[str, float] = {}
    for t in psutil.Process().threads():
        role = ("event loop" if t.id == main_id else "tasks" if "Dask-Default-Threads" in names.get(t.id, "")
                else "other")
        out[role] = out.get(role, 0.0) + t.user_time + t.system_time
    return out


def _cluster_cpu(pipe: Pipeline) -> dict[str, float]:
    """CPU seconds so far of the embedded cluster's processes (children of this process): the
    scheduler process, the workers' threads by role (:func:`_worker_threads`), anything else."""
    import psutil

    runner = pipe.session.runner()
    out = {"scheduler": 0.0, "other processes": 0.0}
    workers = runner.client.run(_worker_threads)
    for threads in workers.values():
        for role, cpu in threads.items():
            out[f"workers' {role}"] = out.get(f"workers' {role}", 0.0) + cpu
    worker_pids = set(runner.worker_pids().values())
    scheduler_pid = runner.client.run_on_scheduler(os.getpid)
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.pid in worker_pids:
                continue
            t = proc.cpu_times()
            kind = ("scheduler" if proc.pid == scheduler_pid or "spec" in proc.cmdline()
                    else "the cluster's host" if "zephon_dask.execution.host" in " ".join(proc.cmdline())
                    else "other processes")
            out[kind] = out.get(kind, 0.0) + t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return out


def _executed(dask_worker) -> int:
    return dask_worker.state.executed_count


def _tasks_run(runner) -> list[int]:
    """Tasks each worker has run so far, in the order of the workers' addresses."""
    counts = runner.client.run(_executed)
    return [counts[address] for address in sorted(counts)]


def _self_cpu() -> float:
    t = os.times()
    return t.user + t.system


def _timed_pass(pipe: Pipeline, first_only: bool = False, warm: bool = False) -> dict:
    """One pass over ``pipe`` (``warm``: its cluster is up, and its processes' CPU is reported)."""
    tally = Tally()
    cluster0 = _cluster_cpu(pipe) if warm else {}
    cpu0, threads0, self0 = _cpu(), _thread_cpu(), _self_cpu()
    t0 = time.perf_counter()
    it = iter(pipe)  # starts the cluster on first use and submits the first windows
    t_iter = time.perf_counter()
    first = None
    for batch in it:
        if first is None:
            first = time.perf_counter() - t0
            if first_only:
                break
        tally.add(batch)
    t_end = time.perf_counter()
    self1 = _self_cpu()  # before this benchmark's own measuring (psutil) below
    threads = _thread_cpu()
    cpu, cpu_self = _cpu() - cpu0, self1 - self0
    cluster = {k: v - cluster0.get(k, 0.0) for k, v in _cluster_cpu(pipe).items()} if warm else {}
    return {"wall": t_end - t0, "start": t_iter - t0, "first": first, "tokens": tally.tokens,
            "cpu": cpu, "cpu_self": cpu_self - tally.cpu, "cpu_tally": tally.cpu,
            "cpu_parts": {"training process": cpu_self, **cluster},
            "cpu_threads": {k: v - threads0.get(k, 0.0) for k, v in threads.items()},
            "batches": tally.batches, "sha": tally.digest(),
            "packing": pipe.stats().packing_efficiency}


# -- a training loop's own work, fed from memory or from the pipeline --------------------------

STEP_PY = 150_000  # iterations of the pure-Python part of a step
STEP_MM = 384  # side of the step's square float32 matmul (one torch thread)
HELD = 16  # batches the loop fed from memory cycles through


def train_step(batch) -> float:
    """A fixed CPU step: pure Python (the GIL held) plus a small torch matmul; its wall time."""
    t = time.perf_counter()
    tokens = torch.from_numpy(batch["tokens"])
    acc = 0
    for i in range(STEP_PY):
        acc += i * i
    a = torch.full((STEP_MM, STEP_MM), float(int(tokens[0, 0]) % 7 + acc % 3), dtype=torch.float32)
    for _ in range(4):
        a = torch.tanh(a @ a / STEP_MM)
    return time.perf_counter() - t


def _loop(batches, steps: int, tally: Tally | None = None) -> dict:
    """``steps`` training steps over ``batches``, each batch hashed into ``tally`` if given: the
    median step, the wall, the training process's CPU (in all, by thread role, in the steps, in
    ``next()``), the hashing's (this benchmark's, not the pipeline's) and other processes' CPU."""
    machine0, tree0 = _cpu_snapshot(), _cpu()
    threads0, hashed0 = _thread_cpu(), tally.cpu if tally is not None else 0.0
    times = []
    batches = iter(batches)
    self0, t0 = _self_cpu(), time.perf_counter()
    tokens, work_cpu, next_cpu = 0, 0.0, 0.0
    for _ in range(steps):
        c = time.thread_time()
        batch = next(batches, None)
        next_cpu += time.thread_time() - c
        if batch is None:
            raise SystemExit(f"the stream ended after {len(times)} of {steps} steps")
        if tally is not None:
            tally.add(batch)
        c = time.thread_time()
        tokens += int(np.count_nonzero(batch["document_ids"] >= 0))
        times.append(train_step(batch))
        work_cpu += time.thread_time() - c
    wall, cpu_self = time.perf_counter() - t0, _self_cpu() - self0
    threads, tree, machine = _thread_cpu(), _cpu(), _cpu_snapshot()
    others = None if machine0 is None or machine is None else max(0.0, machine[0] - machine0[0] - (tree - tree0))
    return {"step": statistics.median(times), "work": sum(times), "wall": wall, "cpu_self": cpu_self,
            "work_cpu": work_cpu, "next_cpu": next_cpu,
            "hash_cpu": (tally.cpu if tally is not None else 0.0) - hashed0, "tokens": tokens,
            "threads": {k: v - threads0.get(k, 0.0) for k, v in threads.items()}, "others_cpu": others}


def _unfinished_tasks(dask_scheduler) -> int:
    """Tasks the scheduler has not finished (run on the scheduler): queued, waiting for
    dependencies, running or waiting for a worker."""
    return sum(1 for ts in dask_scheduler.tasks.values()
               if ts.state in ("queued", "waiting", "processing", "no-worker"))


def _wait_idle(pipe: Pipeline, timeout: float = 300.0) -> float:
    """Wait until the pipeline computes nothing: every window in flight finished (its result held
    on a worker) and no task anywhere on the cluster, seen on three polls 0.1 s apart; the
    seconds waited."""
    client = pipe.session.runner().client
    t0, quiet = time.perf_counter(), 0
    while quiet < 3:
        if time.perf_counter() - t0 > timeout:
            raise SystemExit(f"the pipeline still computed after {timeout:.0f} s")
        time.sleep(0.1)
        quiet = quiet + 1 if client.run_on_scheduler(_unfinished_tasks) == 0 else 0
    return time.perf_counter() - t0


def _lead_in(pipe: Pipeline, it, tally: Tally) -> int:
    """Untimed steps fed from ``it`` until the windows that were in flight (computed while the
    loop fed from memory ran) are used up: the windows after them are computed while this loop
    runs, as in a long run. The steps taken."""
    fetcher = pipe.session.stream.fetcher
    target, steps = fetcher.windows_done + len(fetcher.inflight), 0
    while fetcher.windows_done < target:
        batch = next(it)
        tally.add(batch)
        train_step(batch)
        steps += 1
    return steps


def _train_child(pipe: Pipeline, steps: int, rounds: int) -> dict:
    """One iteration over ``pipe`` feeding a training loop, in steady state, alternately with the
    same loop fed from ``HELD`` batches held in memory: after a first round that starts the
    cluster and fills the prefetch, each round waits until the pipeline computes nothing, runs
    ``steps`` steps from memory, then continues the iteration (untimed steps until the windows
    computed during the pause are used up, then ``steps`` timed ones). Every delivered batch is
    hashed, in order."""
    torch.set_num_threads(1)
    tally = Tally()
    it = iter(pipe)
    held = list(itertools.islice(it, HELD))
    for batch in held:
        tally.add(batch)
    _loop(it, steps, tally)
    mem, fed = [], []
    for _ in range(rounds):
        idle = _wait_idle(pipe)
        mem.append({**_loop(itertools.cycle(held), steps), "idle_wait": idle})
        lead_in = _lead_in(pipe, it, tally)
        fed.append({**_loop(it, steps, tally), "lead_in": lead_in})
    return {"memory": mem, "pipeline": fed, "batches": tally.batches, "sha": tally.digest(),
            "rss_peak_mb": _rss_mb()}


def pipeline_child(args) -> None:
    """Runs in a fresh interpreter. ``--mode full``: the cold pass, then a warm pass per ``warm``
    line on stdin; ``quit`` closes the pipeline and reports the peak RSS. ``--mode first``: the
    cold pass up to its first batch. ``--mode train``: the training-loop rounds. One JSON line per
    answer."""
    rss_imports = _rss_mb()
    pipe = build_pipeline(WORKLOADS[args.workload], args.data, args.tokenizer, args.workers, args.passes).options(
        head_start=args.head_start)
    if args.windows_per_task is not None:
        pipe = pipe.options(windows_per_task=args.windows_per_task or None)
    try:
        if args.mode == "train":
            print(json.dumps(_train_child(pipe, args.steps, args.rounds)), flush=True)
        else:
            cold = _timed_pass(pipe, first_only=args.mode == "first")
            runner = pipe.session.runner()
            answer = {"cold": cold}
            if args.mode == "full":
                # The head start may compute the whole cold pass in this process: the workers'
                # first tasks (importing the library, loading the spec) would then fall in the first
                # timed warm pass, while the pool's workers do that before theirs are timed.
                answer["tasks_after_cold"] = _tasks_run(runner)
                answer["settle"] = _timed_pass(pipe)
            print(json.dumps({**answer, "rss_imports_mb": rss_imports,
                              "runner": f"{runner.describe()}; {pipe.session.stream.fetcher.windows_per_task} "
                                        "windows per task",
                              "worker_pids": sorted(runner.worker_pids().values())}), flush=True)
        for line in sys.stdin:
            if line.strip() != "warm":
                break
            print(json.dumps(_timed_pass(pipe, warm=True)), flush=True)
    finally:
        pipe.close()
    print(json.dumps({"rss_peak_mb": _rss_mb()}), flush=True)


class PipelineProcess:
    """The pipeline's training process, driven one pass at a time (so passes interleave with the pool's)."""

    def __init__(self, workload: str, data_dir: str, tokenizer_path: str, workers: int, mode: str = "full",
                 steps: int = 0, rounds: int = 0, passes: int = 1, head_start: bool = True,
                 windows_per_task: int | None = None):
        cmd = [sys.executable, os.path.abspath(__file__), CHILD_FLAG, "--workload", workload, "--data", data_dir,
               "--tokenizer", tokenizer_path, "--workers", str(workers), "--mode", mode,
               "--steps", str(steps), "--rounds", str(rounds), "--passes", str(passes), *([] if head_start else ["--no-head-start"]),
               *([] if windows_per_task is None else ["--windows-per-task", str(windows_per_task)])]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.result = self._answer()  # the cold pass, or the training rounds
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
        self.result["leftover_pids"] = [pid for pid in self.result.get("worker_pids", []) if _alive(pid)]
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


def report_training(train: dict) -> tuple[float, float]:
    """Print the training-loop rounds; the median per-round slowdown of the step, and the training
    process's CPU besides the steps per million tokens in the fed rounds (median)."""
    mem, fed = train["memory"], train["pipeline"]
    ratios = [f["step"] / m["step"] - 1 for m, f in zip(mem, fed, strict=True)]
    slowdown = statistics.median(ratios)

    def besides(r: dict) -> dict[str, float]:
        """CPU seconds of the training process outside the steps (and the hashing), by thread role."""
        threads = dict(r["threads"])
        threads["main"] = threads.get("main", 0.0) - r["work_cpu"] - r["hash_cpu"]
        return {"all": r["cpu_self"] - r["work_cpu"] - r["hash_cpu"], **threads}

    per_m = {k: statistics.median(besides(r).get(k, 0.0) / r["tokens"] * 1e6 for r in fed)
             for k in ("all", "main", "event loop", "offload", "other")}
    per_m["next"] = statistics.median(r["next_cpu"] / r["tokens"] * 1e6 for r in fed)
    idle_per_s = statistics.median(besides(r)["all"] / r["wall"] for r in mem)
    outside = statistics.median(1 - r["work"] / r["wall"] for r in fed)
    cores = os.cpu_count() or 1
    spread = ""
    if len(ratios) > 1:
        q = statistics.quantiles(ratios, n=4)
        spread = f" (quartiles {q[0]:+.1%} to {q[2]:+.1%})"

    def others(rounds: list[dict]) -> str:
        shares = [r["others_cpu"] / (r["wall"] * cores) for r in rounds if r["others_cpu"] is not None]
        return f"{statistics.median(shares):.0%}" if shares else "n/a"

    print(f"training loop ({train['workers']} workers; {len(mem)} rounds, each {train['steps']} steps fed from "
          f"{HELD} batches in memory while the pipeline computed nothing, then {train['steps']} fed from the "
          f"continuing iteration): median step {statistics.median(r['step'] for r in mem) * 1e3:.2f} ms from "
          f"memory, {statistics.median(r['step'] for r in fed) * 1e3:.2f} ms from the pipeline; per round: "
          + ", ".join(f"{r:+.1%}" for r in ratios) + f"; median {slowdown:+.1%}"
          + spread
          + "; other processes used "
          f"{others(mem)} of the machine during the memory rounds, {others(fed)} during the fed ones")
    print(f"  fed rounds: {statistics.median(r['tokens'] for r in fed) / 1e6:.2f} M tokens each, "
          f"{outside:.0%} of the loop's wall outside the steps (waiting for batches), after an untimed lead-in "
          f"of {', '.join(str(r['lead_in']) for r in fed)} steps (the windows computed during the pause); "
          f"the pause before each memory round waited {statistics.median(r['idle_wait'] for r in mem):.1f} s "
          f"for the pipeline to go idle")
    print(f"  training-process CPU besides the steps (and this benchmark's hashing), fed rounds: "
          f"{per_m['all']:.3f} s per million tokens (main thread {per_m['main']:.3f}, of which "
          f"{per_m['next']:.3f} in next(): cutting batches, fetching windows; event loop "
          f"{per_m['event loop']:.3f}, offload {per_m['offload']:.3f}, other {per_m['other']:.3f}); "
          f"memory rounds, the pipeline idle: {idle_per_s * 1e3:.1f} ms per second")
    print(f"  the {train['batches']} batches delivered (held, warm-up, lead-ins, rounds; stream of "
          f"{train['passes']} passes) byte-identical to the 1-process loop's first {train['batches']} (sha256): "
          f"{'YES' if train['sha_ok'] else 'NO'}; peak RSS {train['rss_peak_mb']:.0f} MB")
    return slowdown, per_m["all"]


def report(wl: Workload, info: dict, single: dict, pools: list[dict], pipe: dict, workers: int,
           firsts: dict[int, list[float]], train: dict | None) -> None:
    total = single["tokens"]
    cold, settle, warms = pipe["cold"], pipe["settle"], pipe["warm"]
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
        ("pipeline, first pass after the cold one", settle["wall"], settle["tokens"] / settle["wall"],
         settle["first"], None),
        ("pipeline, warm cluster", warm["wall"], warm["tokens"] / warm["wall"], warm["first"], None),
    ]
    print()
    print(f"== {wl.describe()}")
    print(f"pool and warm pipeline: medians of {n} alternating passes; 1-process loop, cold pipeline and the "
          "pass after it (untimed in the ratios): one pass")
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
          f"warm pipeline {statistics.median(w['cpu'] for w in warms):.1f} s")
    for mode, passes in (("pool", pools), ("warm pipeline", warms)):
        parts = sorted({k for p in passes for k in p["cpu_parts"]}, key=list(passes[0]["cpu_parts"]).index)
        print(f"  {mode} by process (medians; hashing in the parent / training process): "
              + ", ".join(f"{k} {statistics.median(p['cpu_parts'].get(k, 0.0) for p in passes):.2f} s" for k in parts))
    self_cpu = statistics.median(w["cpu_self"] for w in warms)
    per_m = statistics.median(w["cpu_self"] / (w["tokens"] / 1e6) for w in warms)
    threads = {k: statistics.median(w["cpu_threads"].get(k, 0.0) for w in warms)
               for k in sorted({k for w in warms for k in w["cpu_threads"]})}
    threads["main"] = threads.get("main", 0.0) - statistics.median(w["cpu_tally"] for w in warms)
    print(f"training process CPU per warm pass (less this benchmark's hashing, "
          f"{statistics.median(w['cpu_tally'] for w in warms):.2f} s): {self_cpu:.2f} s = {per_m:.3f} s per million "
          f"tokens (threads: {', '.join(f'{k} {v:.2f} s' for k, v in threads.items() if v >= 0.005)}); "
          f"cold pass {cold['cpu_self']:.2f} s")
    print(f"cluster start (iter() returning, cold): {cold['start']:.2f} s; pool start: {pool['start']:.2f} s")
    print(f"tasks each worker ran in the cold pass: {', '.join(map(str, pipe['tasks_after_cold']))} (the rest "
          "computed in the training process by the head start); the workers' first tasks, which import the "
          "library and load the spec, fall in the pass after it, which the ratios leave out")
    if firsts:
        print("cold first batch (fresh training process, cluster start included) by workers: "
              + "; ".join(f"{k}: {statistics.median(v):.2f} s ({', '.join(f'{x:.2f}' for x in v)})"
                          for k, v in sorted(firsts.items())))
    print(f"training process RSS: {pipe['rss_imports_mb']:.0f} MB after imports (torch included), "
          f"{pipe['rss_peak_mb']:.0f} MB peak")
    shas = {single["sha"], cold["sha"], settle["sha"], *(p["sha"] for p in pools), *(w["sha"] for w in warms)}
    print(f"batches byte-identical to the 1-process loop (sha256 of all tokens arrays) in all "
          f"{3 + 2 * n} passes: {'YES' if len(shas) == 1 else 'NO'}  [{single['sha'][:16]}, "
          f"{single['batches']} batches, {total:,} real tokens]")
    if pipe["leftover_pids"]:
        print(f"WARNING: Dask worker processes still alive after close(): {pipe['leftover_pids']}")
    else:
        print(f"processes left behind after close(): none ({len(pipe['worker_pids'])} workers checked)")
    slowdown = per_m_train = None
    if train is not None:
        slowdown, per_m_train = report_training(train)
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
    cpu_rounds = [(w["cpu"] / w["tokens"]) / (p["cpu"] / p["tokens"]) for p, w in zip(pools, warms, strict=True)]
    print(f"  CPU per token <= {TARGET_CPU_VS_POOL:.2f}x the pool's (every process of the mode): warm "
          f"{statistics.median(cpu_rounds):.2f}x (median of the rounds: "
          + ", ".join(f"{r:.2f}x" for r in cpu_rounds) + ")")
    print(f"  first batch <= {TARGET_FIRST_BATCH_S:.1f} s: cold {cold['first']:.2f} s, warm {warm['first']:.2f} s")
    print(f"  training-process CPU <= {TARGET_CPU_PER_M:.2f} s per million tokens: warm pass {per_m:.3f} s"
          + (f", training loop (steady state, besides its steps) {per_m_train:.3f} s" if per_m_train is not None else ""))
    if slowdown is not None:
        print(f"  training step slowed <= {TARGET_STEP_SLOWDOWN:.0%}: {slowdown:+.1%}")
    print(f"  peak RSS <= {TARGET_RSS_MB:.0f} MB: {pipe['rss_peak_mb']:.0f} MB")
    if cold["packing"] is not None:
        print(f"  (packing efficiency {cold['packing']:.3f}; {info['windows']} windows)")


def run_training(wl: Workload, args, data_dir: str, tok_path: str, batches_per_window: float) -> dict:
    """The training-loop rounds in a fresh training process with ``cores - 1`` workers, over a stream
    of enough passes for every round (a round's untimed lead-in is at most the windows in flight)."""
    n_train = max(1, (os.cpu_count() or 1) - 1)
    pipe = build_pipeline(wl, data_dir, tok_path, n_train)
    lead_in = 2 * n_train + 4 + REPLICAS  # windows: the default prefetch's, and one per lane to spare
    needed = HELD + args.train_steps * (args.train_rounds + 1) + args.train_rounds * lead_in * batches_per_window
    per_pass = batches_per_window * len(all_windows(pipe.spec))
    passes = int(needed / per_pass) + 2
    proc = PipelineProcess(wl.name, data_dir, tok_path, n_train, mode="train", steps=args.train_steps,
                           rounds=args.train_rounds, passes=passes, head_start=args.head_start,
                           windows_per_task=args.windows_per_task)
    return {**proc.finish(), "workers": n_train, "steps": args.train_steps, "passes": passes}


def run_workload(wl: Workload, args) -> None:
    with tempfile.TemporaryDirectory(prefix="zephon-bench-e2e-") as tmp:
        tok_path, summary = make_data(tmp, wl, args.quick, args.docs)
        pipe = build_pipeline(wl, tmp, tok_path, args.workers)
        windows = all_windows(pipe.spec)
        print(f"\n{wl.describe()}\n{summary}; {len(windows)} windows; {args.workers} workers on {os.cpu_count()} cores",
              flush=True)
        cpu0, wall0 = _cpu_snapshot(), time.perf_counter()
        single = run_single(pipe)
        print(f"1-process loop done: {single['wall']:.2f} s "
              f"({single['wall'] / len(windows) * 1000:.0f} ms per window)", flush=True)
        firsts: dict[int, list[float]] = {}
        for _ in range(args.first_repeat):
            for n in range(1, args.workers + 1):
                proc = PipelineProcess(wl.name, tmp, tok_path, n, mode="first", head_start=args.head_start,
                                       windows_per_task=args.windows_per_task)
                firsts.setdefault(n, []).append(proc.result["cold"]["first"])
                proc.finish()
        if firsts:
            print("cold first batches done: " + "; ".join(f"{k} workers {v}" for k, v in firsts.items()), flush=True)
        child = PipelineProcess(wl.name, tmp, tok_path, args.workers, head_start=args.head_start,
                                windows_per_task=args.windows_per_task)
        print(f"pipeline cold pass done: {child.result['cold']['wall']:.2f} s [{child.result['runner']}]",
              flush=True)
        pools = []
        for i in range(args.repeat):
            pools.append(run_pool(pipe, args.workers))
            warm = child.warm()
            print(f"round {i + 1}/{args.repeat}: pool {pools[-1]['wall_warm']:.2f} s, "
                  f"warm pipeline {warm['wall']:.2f} s", flush=True)
        result = child.finish()
        train = None
        if args.train_steps:
            train = run_training(wl, args, tmp, tok_path, single["batches"] / len(windows))
        info = {"windows": len(windows)}
        info["foreign_cpu"] = _foreign_cpu(cpu0, _cpu_snapshot())
        info["timed_wall"] = time.perf_counter() - wall0
        if train is not None:  # the reference for the training loop's batches, after the timing
            passes = train["passes"]
            ref = run_single(build_pipeline(wl, tmp, tok_path, 1, passes), limit=train["batches"])
            train["sha_ok"] = ref["sha"] == train["sha"] and ref["batches"] == train["batches"]
        report(wl, info, single, pools, result, args.workers, firsts, train)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a fifth of each corpus")
    ap.add_argument("--workload", choices=[*WORKLOADS, "all"], default="all", help="default: all, one after the other")
    ap.add_argument("--docs", type=int, default=None, help="cap the prose corpus at N documents")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                    help="pool processes and Dask workers (default: all cores)")
    ap.add_argument("--repeat", type=int, default=5,
                    help="alternating pool / warm pipeline passes (default 5; medians)")
    ap.add_argument("--first-repeat", type=int, default=2,
                    help="cold first-batch runs per worker count, 1 to --workers (default 2; 0: none)")
    ap.add_argument("--train-steps", type=int, default=TRAIN_STEPS,
                    help=f"timed steps per training-loop round, with cores - 1 workers (default {TRAIN_STEPS}; 0: none)")
    ap.add_argument("--train-rounds", type=int, default=TRAIN_ROUNDS,
                    help=f"training-loop rounds, each fed from memory then from the pipeline (default {TRAIN_ROUNDS})")
    ap.add_argument("--no-head-start", dest="head_start", action="store_false",
                    help="the pipeline with head_start=False: every window on the cluster, none in the training process")
    ap.add_argument("--windows-per-task", type=int, default=None,
                    help="the pipeline's windows_per_task option (default: the pipeline's default, None, "
                         "the automatic choice; 0: None too)")
    ap.add_argument(CHILD_FLAG, dest="child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--tokenizer", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="full", help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--passes", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        pipeline_child(args)
        return
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    for name in WORKLOADS if args.workload == "all" else [args.workload]:
        run_workload(WORKLOADS[name], args)


if __name__ == "__main__":
    main()
