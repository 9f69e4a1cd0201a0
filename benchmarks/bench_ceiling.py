"""The pipeline against the machine's tokenizing limits, in one run: throughput against the
tokenizing ceiling, the first batch against its floor, and where a window's CPU goes.

Workload: a mixture ``prose`` 0.7 / ``code`` 0.3 (sample weights), ``chunk_size=64``,
``tokenize(bos=True, eos=True)``, ``pack(2048)`` wrap, ``shuffle(1024)``, ``batch(8)``,
``canonical_replicas=8``, 8 chunks per window, one full pass. The corpus is
``bench_e2e.py``'s ``mixed`` one (``--quick``: a fifth), or ``--data DIR``: one folder
of JSONL shards per dataset (``DIR/prose``, ``DIR/code``) and a ``tokenizer.json`` in
``DIR`` or ``DIR/tokenizer``.

* **ceiling**: one single-threaded tokenizer process per core (``--procs``), each
  with its share of the documents one pass reads (every ``n``-th, in the pipeline's
  plan order) already in memory, ``encode_batch_fast`` on 64 texts a call, all
  started together: tokens / the slowest process's wall. No pipeline on this machine
  tokenizes faster.
* **first-batch floor**: the same processes on the documents the first batch depends
  on, from the pipeline's own plan: lane 0's first window's chunks
  (``spec.window_chunks(0, 0)``; a shuffle or a pack needs the whole window).
* **pipeline**: one cold pass in a fresh training process (torch imported, the
  embedded cluster with its defaults, head start included): delivered tokens per
  second from ``iter()`` to the last batch (the cluster's start included, as in a
  user's first pass), the first batch, and the CPU of every process of the run; then
  a warm pass on the same cluster. Both also as tokens per CPU second against the
  ceiling's, which a busy machine disturbs less than the wall, and as tokens tokenized
  per second: a pass ends on its last whole global step (``drop_last_step``), so it
  delivers fewer tokens than it tokenizes, by the share its lanes' surplus holds.

Rounds alternate (limits, pipeline, limits, pipeline, ...) so both see the same
machine; ratios are per round. Every batch's ``tokens`` array is hashed (sha256, in
delivery order) and must equal the 1-process loop's (``compute_window`` over every
window in this process). The same loop, its stages timed one by one on
``--profile`` windows, gives the CPU per window by stage (plan, parse, tokenize,
the tokenize operator's own Python, chunk tables, each accumulator, pickling a
result), and the pipeline's CPU beyond the 1-process loop's is what running on the
cluster adds (Dask's messages and serialization, the training process's batches).
Nothing is asserted; the load average is printed. With ``--baseline DIR`` (a source tree of
another version, e.g. from ``git archive main | tar -x -C DIR``) every round also runs the
pipeline's pass with that version (``PYTHONPATH=DIR``), just before this tree's, against the
same round's limits; ``--variant KEY=JSON`` (repeatable) instead runs this tree's pass with
that execution option (e.g. ``dashboard_address=null``) in that place. ``--cores`` samples, in
each cold pass, where the machine's cores go from ``iter()`` to the last batch (every 0.2 s,
from ``/proc``: each thread of the training process by role, each process of the cluster by
main thread and other threads, the machine's other jobs and its idle time): core-seconds by
part as a share of cores x wall, a per-second timeline, when the cluster's start began and
when it took the windows, each window's CPU against the same window in the warm pass, and the
workers' idle tail (the pass's end less when each worker's task thread last computed). The
sampler's own CPU is shown apart. ``--timeline N`` instead prints, for N fresh training processes, a
timeline of the first ``iter()`` to the first batch: each step's start, end and its
thread's CPU, on every thread (the main thread, the head start's driver and pool, the
cluster's start), measured by wrapping the steps' functions.

    python benchmarks/bench_ceiling.py [--quick] [--data DIR] [--rounds N] [--procs N] [--profile N]
        [--baseline DIR | --variant KEY=JSON] [--cores]
    python benchmarks/bench_ceiling.py [--quick] [--data DIR] --timeline N
"""

from __future__ import annotations

import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAYON_NUM_THREADS", "1")

import sys  # noqa: E402

TOKENIZER_CHILD = "--_tokenizer-child"
PIPELINE_CHILD = "--_pipeline-child"
TIMELINE_CHILD = "--_timeline-child"
BATCH = 64  # texts per encode_batch_fast call, as a chunk


def tokenizer_child(tokenizer_path: str, texts_path: str, k: int, n: int) -> None:
    """One ceiling process: its share of each stage's texts in memory, then one timed stage per
    ``go`` line on stdin, one JSON line each (tokens, seconds)."""
    import json
    import pickle
    import time

    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer_path)
    with open(texts_path, "rb") as f:
        stages = {name: texts[k::n] for name, texts in pickle.load(f).items()}
    print("ready", flush=True)
    for line in sys.stdin:
        texts = stages[line.split()[1]]
        t, cpu = time.perf_counter(), time.process_time()
        tokens = 0
        for i in range(0, len(texts), BATCH):
            tokens += sum(len(e.ids) for e in tok.encode_batch_fast(texts[i:i + BATCH], add_special_tokens=False))
        print(json.dumps({"tokens": tokens, "s": time.perf_counter() - t, "cpu": time.process_time() - cpu}),
              flush=True)


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == TOKENIZER_CHILD:
    tokenizer_child(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    sys.exit(0)

import argparse  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import pickle  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from bench_e2e import (  # noqa: E402
    WORKLOADS,
    Tally,
    _cluster_cpu,
    _cpu,
    _rss_mb,
    _self_cpu,
    all_windows,
    make_data,
    run_single,
)

from zephon_dask import Dataset, MixtureWorkSource, Pipeline  # noqa: E402
from zephon_dask.core.window import apply_record_ops, read_chunk, read_records  # noqa: E402
from zephon_dask.operators.base import WindowContext  # noqa: E402
from zephon_dask.operators.table import SampleTable  # noqa: E402
from zephon_dask.operators.tokenize import Tokenize  # noqa: E402

WEIGHTS = {"prose": 0.7, "code": 0.3}
TARGET_CEILING = 0.90
TARGET_FLOOR = 1.3


def tokenizer_path(data: str) -> str:
    for path in (os.path.join(data, "tokenizer.json"), os.path.join(data, "tokenizer", "tokenizer.json")):
        if os.path.isfile(path):
            return path
    raise SystemExit(f"no tokenizer.json in {data} or {data}/tokenizer")


def build(data: str, tok: str, workers: int | None = None, options: dict | None = None) -> Pipeline:
    """The workload's pipeline over ``data`` (see the module docstring); ``options``: execution
    options beside the defaults (``--variant``)."""
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(tok).get_vocab()
    bos = "<|bos|>" if "<|bos|>" in vocab else "<|endoftext|>"
    eos = "<|eos|>" if "<|eos|>" in vocab else "<|endoftext|>"
    datasets = [Dataset.from_jsonl(name, os.path.join(data, name), progress=False) for name in WEIGHTS]
    source = MixtureWorkSource(datasets, weights=WEIGHTS, chunk_size=64, seed=42)
    pipe = (Pipeline(source).tokenize(tok, field="text", bos=True, eos=True, bos_id=bos, eos_id=eos)
            .pack(2048, algorithm="wrap").shuffle(1024).batch(8).options(canonical_replicas=8))
    pipe = pipe.options(**options) if options else pipe
    return pipe if workers is None else pipe.options(n_workers=workers)


def plan_texts(pipe: Pipeline) -> dict[str, list[str]]:
    """The texts one pass tokenizes, in the plan's order (``all``), and those of lane 0's first
    window (``floor``): what the first batch depends on."""
    spec = pipe.spec
    field = next(op for op in spec.record_ops if isinstance(op, Tokenize)).field

    def texts(chunks) -> list[str]:
        return [rec[field] for g in chunks for rec in read_chunk(spec, g)[1]]

    return {"floor": texts(spec.window_chunks(0, 0)),
            "all": texts(g for lane, w in all_windows(spec) for g in spec.window_chunks(lane, w))}


class Limits:
    """``procs`` tokenizer processes holding their share of ``texts_path``'s stages, started once."""

    def __init__(self, tok: str, texts_path: str, procs: int):
        cmd = [sys.executable, os.path.abspath(__file__), TOKENIZER_CHILD, tok, texts_path]
        self.procs = [subprocess.Popen([*cmd, str(k), str(procs)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       text=True) for k in range(procs)]
        for p in self.procs:
            if p.stdout.readline().strip() != "ready":
                raise SystemExit("a tokenizer process failed to start")

    def run(self, stage: str) -> dict:
        """Every process on its share of ``stage`` at once: tokens, the slowest wall, tokens/s, CPU."""
        for p in self.procs:
            p.stdin.write(f"go {stage}\n")
            p.stdin.flush()
        res = [json.loads(p.stdout.readline()) for p in self.procs]
        tokens, wall = sum(r["tokens"] for r in res), max(r["s"] for r in res)
        return {"tokens": tokens, "s": wall, "rate": tokens / wall, "cpu": sum(r["cpu"] for r in res)}

    def close(self) -> None:
        for p in self.procs:
            p.stdin.close()
            p.wait(timeout=60)


class CoreSampler:
    """Where the machine's cores go over a pass, sampled every ``every`` seconds on a thread of
    the training process: each thread's CPU in this process (by role, from its Python name) and in
    every process below it (``/proc``: a process's main thread and its other threads), and the
    machine's busy and idle time (``/proc/stat``: other jobs included). Holds state (the samples)."""

    def __init__(self, every: float = 0.2):
        import threading

        self.every, self.samples, self.marks = every, [], {}
        self.tick = os.sysconf("SC_CLK_TCK")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-core-sampler", daemon=True)
        self.t0 = time.perf_counter()

    @staticmethod
    def _machine() -> tuple[float, float]:
        """Jiffies busy and idle (idle + iowait) of every core since boot."""
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        idle = v[3] + v[4]
        return sum(v[:8]) - idle, idle

    def _threads(self, pid: int) -> dict[int, float]:
        out = {}
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            return out
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                out[int(tid)] = (int(fields[11]) + int(fields[12])) / self.tick
            except (OSError, IndexError, ValueError):
                pass
        return out

    def _descendants(self) -> dict[int, int]:
        """Every process below this one: pid -> parent pid."""
        parents = {}
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    with open(f"/proc/{name}/stat") as f:
                        parents[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    pass
        mine, frontier = {}, [os.getpid()]
        while frontier:
            p = frontier.pop()
            for child, parent in parents.items():
                if parent == p and child not in mine:
                    mine[child] = parent
                    frontier.append(child)
        return mine

    def _sample(self) -> None:
        import threading

        names = {t.native_id: t.name for t in threading.enumerate()}
        me = os.getpid()
        own = {}
        for tid, cpu in self._threads(me).items():
            name = names.get(tid, "")
            role = ("main" if tid == me else "head start" if name.startswith("zephon-head-start")
                    else "cluster start thread" if name == "zephon-cluster-start"
                    else "event loop" if "IO loop" in name or "IOLoop" in name
                    else "the benchmark's sampler" if name == "bench-core-sampler" else "other")
            own[tid] = (role, cpu)
        procs = {pid: (parent, self._threads(pid)) for pid, parent in self._descendants().items()}
        self.samples.append((time.perf_counter() - self.t0, self._machine(), own, procs))

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self._sample()

    def start(self) -> None:
        self.t0 = time.perf_counter()
        self._sample()
        self._thread.start()

    def mark(self, name: str) -> None:
        self.marks.setdefault(name, time.perf_counter() - self.t0)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._sample()

    def shares(self, roles: dict[int, str], wall: float, cores: int, bins: float = 1.0) -> dict:
        """Core-seconds by role over [0, wall] (``roles``: pid -> role for the processes below;
        a process's main thread is ``<role>: main``, its other threads ``<role>: threads``), the
        machine's other jobs and idle; and the same per ``bins`` seconds."""
        total: dict[str, float] = {}
        series: list[dict[str, float]] = [{} for _ in range(int(wall / bins) + 1)]

        def add(role: str, seconds: float, t: float) -> None:
            if seconds > 0:
                total[role] = total.get(role, 0.0) + seconds
                b = series[min(int(t / bins), len(series) - 1)]
                b[role] = b.get(role, 0.0) + seconds

        for (t_a, m_a, own_a, procs_a), (t_b, m_b, own_b, procs_b) in itertools.pairwise(self.samples):
            t = (t_a + t_b) / 2
            ours = 0.0
            for tid, (role, cpu) in own_b.items():
                d = cpu - own_a.get(tid, (role, 0.0))[1]
                add(f"training process: {role}", d, t)
                ours += d
            for pid, (_, threads) in procs_b.items():
                before = procs_a.get(pid, (0, {}))[1]
                role = roles.get(pid, "other processes")
                for tid, cpu in threads.items():
                    d = cpu - before.get(tid, 0.0)
                    add(f"{role}: {'main' if tid == pid else 'threads'}", d, t)
                    ours += d
            busy = (m_b[0] - m_a[0]) / self.tick
            idle = (m_b[1] - m_a[1]) / self.tick
            add("other jobs on the machine", busy - ours, t)
            add("idle", idle, t)
        # when each process's threads last computed: the start of the last interval between two
        # samples in which they used over 30 ms, plus what they used in it (a busy thread, alone)
        last: dict[str, float] = {}
        for (t_a, _, _, procs_a), (t_b, _, _, procs_b) in itertools.pairwise(self.samples):
            for pid, (_, threads) in procs_b.items():
                before = procs_a.get(pid, (0, {}))[1]
                busy = sum(cpu - before.get(tid, 0.0) for tid, cpu in threads.items() if tid != pid)
                if busy > 0.03:
                    last[roles.get(pid, "other processes")] = t_a + min(busy, t_b - t_a)
        return {"total": total, "series": series, "wall": wall, "cores": cores, "marks": self.marks, "bins": bins,
                "last busy": last}


def _pass(pipe: Pipeline, warm: bool, sampler: CoreSampler | None = None) -> dict:
    """One pass over ``pipe``: wall from ``iter()`` (a cold pass: the cluster's start included),
    first batch, delivered tokens, hashes, the CPU of this process and its children, and by
    process and thread (``warm``: the cluster is up before the pass; a cold pass counts the
    cluster's processes from their start). ``sampler``: where the cores went, over time."""
    tally = Tally()
    cluster0 = _cluster_cpu(pipe) if warm else {}
    cpu0, self0, threads0 = _cpu(), _self_cpu(), _threads()
    if sampler is not None:
        sampler.start()
    t0 = time.perf_counter()
    first, slots = None, 0
    for batch in pipe:
        if first is None:
            first = time.perf_counter() - t0
        slots += np.asarray(batch["tokens"]).size
        tally.add(batch)
    wall = time.perf_counter() - t0
    cores = None
    if sampler is not None:
        sampler.stop()
        cores = core_shares(pipe, sampler, wall, first)
    own, threads = _self_cpu() - self0 - tally.cpu, _threads()
    parts = {f"training process: {k}": v - threads0.get(k, 0.0) for k, v in threads.items()}
    parts["training process: main"] -= tally.cpu
    parts["training process: other threads (head start)"] = own - sum(parts.values())
    parts.update({k: v - cluster0.get(k, 0.0) for k, v in _cluster_cpu(pipe).items()})
    return {"wall": wall, "first": first, "tokens": slots, "batches": tally.batches, "sha": tally.digest(),
            "cpu": _cpu() - cpu0 - tally.cpu, "parts": parts, "hashing": tally.cpu,
            **({"cores": cores} if cores is not None else {})}


def core_shares(pipe: Pipeline, sampler: CoreSampler, wall: float, first: float) -> dict:
    """The sampler's shares with the cluster's processes named (once the pass is over) and the
    windows computed in this process."""
    runner = pipe.session.runner()
    workers = runner.worker_pids()
    roles = {pid: f"worker {i}" for i, (_, pid) in enumerate(sorted(workers.items()))}
    roles[runner.client.run_on_scheduler(os.getpid)] = "scheduler"
    import psutil

    for proc in psutil.Process().children(recursive=True):
        try:
            if "zephon_dask.execution.host" in " ".join(proc.cmdline()) and proc.pid not in roles:
                roles[proc.pid] = "host"
        except psutil.Error:
            pass
    sampler.marks["first batch"] = first
    out = sampler.shares(roles, wall, os.cpu_count() or 1)
    out["computed here"] = list(runner.computed_here)
    return out


def pipeline_child(data: str, tok: str, cores: bool = False, options: dict | None = None) -> None:
    """A cold pass in this fresh training process, then a warm one (the cluster up); one JSON line.
    ``cores``: the cold pass's cores sampled over time (:class:`CoreSampler`)."""
    import torch  # noqa: F401  (a training process has torch loaded)

    sampler = None
    if cores:
        from zephon_dask.execution import head_start

        sampler = CoreSampler()
        for owner, name, label in [(head_start.Boot, "begin", "the cluster's start begins"),
                                   (head_start.HeadStart, "hand_over", "the cluster takes the windows")]:
            fn = getattr(owner, name)

            def wrapper(*args, _fn=fn, _label=label, **kwargs):
                sampler.mark(_label)
                return _fn(*args, **kwargs)

            setattr(owner, name, wrapper)
        from zephon_dask.consumer import fetcher

        get = fetcher.WindowFetcher.get

        def taken(self, lane, _get=get):  # each window's Made, as taken (where, seconds, CPU)
            out = _get(self, lane)
            if out is not None:
                made.append([out.lane, out.window, out.made.worker, out.made.seconds, out.made.cpu,
                             time.perf_counter() - sampler.t0])
            return out

        fetcher.WindowFetcher.get = taken
    made: list = []
    pipe = build(data, tok, options=options)
    try:
        cold = _pass(pipe, warm=False, sampler=sampler)
        if sampler is not None:
            cold["cores"]["made"], made[:] = list(made), []
        warm = _pass(pipe, warm=True)
        if sampler is not None:
            cold["cores"]["made warm"] = list(made)
    finally:
        pipe.close()
    import zephon_dask

    print(json.dumps({**cold, "warm": warm, "rss_mb": _rss_mb(), "package": zephon_dask.__file__}), flush=True)


def timeline_child(data: str, tok: str) -> None:
    """The first batch of this fresh training process, its steps timed on every thread; one JSON
    line: ``[label, thread, start, end, thread CPU]`` per step, times from ``iter()``."""
    import functools
    import threading

    import torch  # noqa: F401  (a training process has torch loaded)

    from zephon_dask.consumer import stream
    from zephon_dask.core import window
    from zephon_dask.execution import head_start
    from zephon_dask.operators import tokenize
    from zephon_dask.pipeline import session

    events: list = []

    def timed(owner, name: str, label: str) -> None:
        fn = getattr(owner, name)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            t, cpu = time.perf_counter(), time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                events.append([label, threading.current_thread().name, t, time.perf_counter(),
                               time.thread_time() - cpu])

        setattr(owner, name, wrapper)

    for owner, name, label in [
        (session.Session, "open_stream", "open the stream (runner, fetcher, first submissions)"),
        (head_start.HeadStart, "_compute", "head start: the first windows"),
        (window, "read_records", "read + parse a chunk's records"),
        (head_start, "chunk_output", "a chunk's record operators (tokenize)"),
        (tokenize.HFTokenizer, "encode_batch", "  of which encode_batch_fast"),
        (head_start, "finish_window", "the window's accumulators (pack, shuffle)"),
        (stream.BatchStream, "_fill", "consumer: wait for the window, take it"),
        (stream, "check_first_window", "consumer: check the first window"),
        (head_start.Boot, "begin", "the cluster's start may begin"),
    ]:
        timed(owner, name, label)
    pipe = build(data, tok)
    t0 = time.perf_counter()
    next(iter(pipe))
    first = time.perf_counter() - t0
    pipe.close()
    print(json.dumps({"first": first, "events": [[e[0], e[1], e[2] - t0, e[3] - t0, e[4]] for e in events
                                                 if e[2] >= t0 and e[2] - t0 <= first]}), flush=True)


def timelines(data: str, tok: str, n: int) -> None:
    for k in range(n):
        out = subprocess.run([sys.executable, os.path.abspath(__file__), TIMELINE_CHILD, data, tok],
                             stdout=subprocess.PIPE, text=True, timeout=600)
        if out.returncode:
            raise SystemExit(f"the timeline process failed (exit {out.returncode})")
        got = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"\nfresh training process {k + 1}/{n}: first batch {got['first'] * 1e3:.0f} ms after iter() "
              f"(load average {os.getloadavg()[0]:.1f}); ms from iter(): start, end, wall, thread CPU")
        for label, thread, a, b, cpu in sorted(got["events"], key=lambda e: e[2]):
            print(f"  {a * 1e3:7.1f} {b * 1e3:7.1f} {(b - a) * 1e3:7.1f} {cpu * 1e3:7.1f}  {thread[:24]:24s} {label}")


def _threads() -> dict[str, float]:
    """CPU seconds of this process's live threads by role: the training loop (``main``), Dask's
    event loop (client, nannies), the rest (the head start's windows, also those of threads gone)."""
    import threading

    import psutil

    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    for t in psutil.Process().threads():
        name = names.get(t.id, "")
        role = ("main" if t.id == threading.main_thread().native_id
                else "event loop" if "IO loop" in name or "IOLoop" in name else "other threads (head start)")
        out[role] = out.get(role, 0.0) + t.user_time + t.system_time
    return out


def run_pipeline(data: str, tok: str, tree: str | None = None, cores: bool = False,
                 options: dict | None = None) -> dict:
    """A fresh training process's passes (``tree``: with that source tree's ``zephon_dask``;
    ``cores``: the cold pass's cores sampled; ``options``: execution options beside the defaults)."""
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join([os.path.abspath(tree), env.get("PYTHONPATH", "")])
    # run in the tree: a version whose cluster host imports the working directory's zephon_dask first
    # (before it was started with -P) then runs that version's cluster code too
    out = subprocess.run([sys.executable, os.path.abspath(__file__), PIPELINE_CHILD, os.path.abspath(data),
                          os.path.abspath(tok), *(["--cores"] if cores else []),
                          *(["--options", json.dumps(options)] if options else [])],
                         stdout=subprocess.PIPE, text=True, timeout=1800, env=env,
                         cwd=os.path.abspath(tree) if tree is not None else None)
    if out.returncode:
        raise SystemExit(f"the pipeline process failed (exit {out.returncode})")
    got = json.loads(out.stdout.strip().splitlines()[-1])
    if tree is not None and not got["package"].startswith(os.path.abspath(tree)):
        raise SystemExit(f"the baseline's pass imported {got['package']}, not the tree {tree}")
    return got


def profile_windows(pipe: Pipeline, count: int) -> tuple[dict[str, float], int]:
    """CPU seconds by stage over the first ``count`` windows (in need order), this thread only."""
    spec = pipe.spec
    tokenizer = next(op for op in spec.record_ops if isinstance(op, Tokenize))
    encode = getattr(tokenizer.tokenizer, "tokenizer", None)
    stages: dict[str, float] = {}

    def add(name: str, t: float) -> float:
        now = time.thread_time()
        stages[name] = stages.get(name, 0.0) + now - t
        return now

    windows = all_windows(spec)[:count]
    for lane, w in windows:
        t = time.thread_time()
        chunks = spec.window_chunks(lane, w)
        t = add("plan (chunks, pointers)", t)
        tables = []
        for g in chunks:
            ds, shard, offset = spec.source.chunk_arrays(g)
            pointers = np.stack([ds, shard, offset], axis=1)
            t = add("plan (chunks, pointers)", t)
            records = read_records(spec.datasets, ds, shard, offset, f"chunk {g}")
            t = add("parse (read + JSON)", t)
            encoding = 0.0
            if encode is not None:
                encs = encode.encode_batch_fast([r[tokenizer.field] for r in records], add_special_tokens=False)
                [e.ids for e in encs]  # the ids as lists, as every caller of the tokenizer gets them
                encoding = time.thread_time() - t
                t = add("tokenize (encode_batch_fast, ids)", t)
            out = apply_record_ops(spec.record_ops, spec.source.names, g, pointers, records)
            # the record operators (encoding again, less its time) and the chunk's table
            t = add("record ops besides encoding, chunk table", t + encoding)
            tables.append(out.table)
        table = SampleTable.concat(tables)
        t = add("window table (concat)", t)
        ctx = WindowContext(spec.seed, lane, w, spec.source.names)
        for op in spec.accumulators:
            table = op.apply(table, ctx)
            t = add(op.name, t)
        blob = pickle.dumps(table, protocol=5)
        pickle.loads(blob)
        add("pickle a result (dumps + loads)", t)
    return stages, len(windows)


GROUPS = [  # (label, what a role starts with), first match wins
    ("windows in the training process (head start)", ("training process: head start",)),
    ("windows in the workers (task threads)", ("worker 0: threads", "worker 1: threads", "worker")),
    ("the cluster's start: host process (imports, forks)", ("host",)),
    ("the cluster's start: its thread in the training process", ("training process: cluster start thread",)),
    ("scheduler process", ("scheduler",)),
    ("training process: main thread (consumer; hashing)", ("training process: main",)),
    ("training process: event loop (client, nannies)", ("training process: event loop",)),
    ("training process: the benchmark's sampler", ("training process: the benchmark's sampler",)),
    ("training process: other threads", ("training process",)),
    ("other processes", ("other processes",)),
    ("other jobs on the machine", ("other jobs",)),
    ("idle", ("idle",)),
]


def group(role: str) -> str:
    if role.startswith("worker") and role.endswith(": main"):
        return "workers' event loops (start, messages)"
    return next(label for label, prefixes in GROUPS if role.startswith(prefixes))


def cores_report(name: str, cores: dict, hashing: float) -> dict[str, float]:
    """Print where a cold pass's cores went (shares of cores x wall, and a timeline); the shares."""
    wall, n = cores["wall"], cores["cores"]
    grouped: dict[str, float] = {}
    for role, sec in cores["total"].items():
        grouped[group(role)] = grouped.get(group(role), 0.0) + sec
    budget = wall * n
    print(f"  {name}: where the {n} cores went over the cold pass ({wall:.1f} s wall, {budget:.1f} core-seconds; "
          f"sampled every 0.2 s; the benchmark's hashing {hashing:.2f} s is in the main thread's):")
    for label in [g for g, _ in GROUPS[:1]] + ["windows in the workers (task threads)"] + [
            g for g, _ in GROUPS[2:5]] + ["workers' event loops (start, messages)"] + [g for g, _ in GROUPS[5:]]:
        if label in grouped:
            print(f"    {label:58s} {grouped[label]:7.2f} s {grouped[label] / budget:6.1%}")
    print(f"    {'(sum)':58s} {sum(grouped.values()):7.2f} s {sum(grouped.values()) / budget:6.1%}")
    marks = ", ".join(f"{k} {v:.2f} s" for k, v in sorted(cores["marks"].items(), key=lambda kv: kv[1]))
    print(f"    marks (from iter()): {marks}; windows computed here: {len(cores['computed here'])} "
          f"{cores['computed here']}")
    cols = ["head start", "worker 0", "worker 1", "cluster", "training", "other jobs", "idle"]

    def col(role: str) -> str:
        if role.startswith("training process: head start"):
            return "head start"
        if role.startswith(("worker 0: threads", "worker 1: threads")):
            return role.split(":")[0]
        if role.startswith(("host", "scheduler", "training process: cluster start", "worker")):
            return "cluster"
        if role.startswith("training process"):
            return "training"
        return "other jobs" if role.startswith(("other",)) else "idle"

    print("    cores used per second: " + " ".join(f"{c:>10s}" for c in ["t (s)", *cols]))
    for i, b in enumerate(cores["series"]):
        row = dict.fromkeys(cols, 0.0)
        for role, sec in b.items():
            row[col(role)] += sec
        span = min(cores["bins"], wall - i * cores["bins"])
        if span > 0.05:
            print("                           " + " ".join(
                [f"{i * cores['bins']:10.0f}", *(f"{row[c] / span:10.2f}" for c in cols)]))
    ends = {k: v for k, v in cores["last busy"].items() if k.startswith("worker")}
    print("    the pass's end: " + ", ".join(f"{k}'s task thread last busy at {v:.2f} s" for k, v in sorted(ends.items()))
          + f"; the last batch at {wall:.2f} s; the workers' idle tail {sum(wall - v for v in ends.values()):.2f} "
          "core-seconds")
    if "made" in cores:
        warm = {(lane, w): cpu for lane, w, _, _, cpu, _ in cores.get("made warm", [])}
        here = [(lane, w, cpu) for lane, w, where, _, cpu, _ in cores["made"] if where.startswith("pid")]
        print("    windows' CPU (their threads'), cold pass against the same window in the warm pass: "
              + ", ".join(f"({lane},{w}) {cpu:.2f}/{warm.get((lane, w), 0):.2f} s{' here' if (lane, w, cpu) in here else ''}"
                          for lane, w, _, _, cpu, _ in cores["made"]))
        cold_cpu = sum(m[4] for m in cores["made"])
        print(f"    in all: {cold_cpu:.2f} s cold, {sum(warm.values()):.2f} s warm")
    return {k: v / budget for k, v in grouped.items()}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a fifth of bench_e2e.py's mixed corpus, one round")
    ap.add_argument("--data", help="a corpus folder (DIR/prose, DIR/code, a tokenizer.json); default: generated")
    ap.add_argument("--rounds", type=int, default=None, help="alternating rounds (default 2; --quick 1)")
    ap.add_argument("--procs", type=int, default=os.cpu_count() or 1, help="tokenizer processes (default: cores)")
    ap.add_argument("--profile", type=int, default=16, help="windows profiled by stage (default 16)")
    ap.add_argument("--baseline", help="a source tree of another version: its pass runs in every round too")
    ap.add_argument("--variant", action="append", default=[], metavar="KEY=JSON",
                    help="an execution option (a JSON value, e.g. dashboard_address=null): every round also "
                         "runs this tree's pass with it, as the baseline (instead of --baseline)")
    ap.add_argument("--cores", action="store_true",
                    help="also sample where the cores go over each cold pass (shares of cores x wall, a timeline)")
    ap.add_argument("--timeline", type=int, default=0, metavar="N",
                    help="only the first batch's timeline, in N fresh training processes")
    args = ap.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 2)
    if args.variant and args.baseline:
        raise SystemExit("--variant and --baseline both fill the baseline's pass: give one")
    variant = {k: json.loads(v) for k, _, v in (item.partition("=") for item in args.variant)}
    with tempfile.TemporaryDirectory(prefix="zephon-bench-ceiling-") as tmp:
        if args.data:
            data, tok, summary = args.data, tokenizer_path(args.data), f"corpus {args.data}"
        else:
            data = tmp
            tok, summary = make_data(tmp, WORKLOADS["mixed"], args.quick, None)
        if args.timeline:
            timelines(data, tok, args.timeline)
            return
        pipe = build(data, tok, workers=1)
        texts = plan_texts(pipe)
        texts_path = os.path.join(tmp, "texts.pickle")
        with open(texts_path, "wb") as f:
            pickle.dump(texts, f, protocol=5)
        n_windows = len(all_windows(pipe.spec))
        print(f"{summary}\none pass: {len(texts['all']):,} documents, {n_windows} windows; the first batch "
              f"depends on {len(texts['floor'])} documents (lane 0's first window, "
              f"{len(pipe.spec.window_chunks(0, 0))} chunks); {args.procs} tokenizer processes on "
              f"{os.cpu_count()} cores", flush=True)
        t = time.process_time()
        single = run_single(pipe)
        single_cpu = time.process_time() - t
        print(f"1-process loop: {single['wall']:.1f} s, {single_cpu:.1f} s CPU, {single['batches']} batches",
              flush=True)
        stages, profiled = profile_windows(pipe, args.profile)
        load0 = os.getloadavg()
        limits = Limits(tok, texts_path, args.procs)
        rows = []
        try:
            for r in range(rounds):
                floor, ceiling = limits.run("floor"), limits.run("all")
                base = (run_pipeline(data, tok, args.baseline, args.cores) if args.baseline
                        else run_pipeline(data, tok, cores=args.cores, options=variant) if variant else None)
                p = run_pipeline(data, tok, cores=args.cores)
                rows.append({"floor": floor, "ceiling": ceiling, "pipe": p, **({"base": base} if base else {})})
                if base is not None:
                    print(f"round {r + 1}/{rounds}, baseline: first batch {base['first']:.2f} s "
                          f"({base['first'] / floor['s']:.2f}x the floor), cold pass "
                          f"{base['tokens'] / base['wall'] / ceiling['rate']:.2f}x the ceiling", flush=True)
                for label, run in (("baseline", base), ("this tree", p)):
                    if run is not None and "cores" in run:
                        run["shares"] = cores_report(label, run["cores"], run["hashing"])
                        made = sum(m[4] for m in run["cores"].get("made", []))
                        print(f"    the windows' own CPU {made:.2f} s (their chunks' and their own, where they were "
                              f"computed) against the ceiling's processes' {ceiling['cpu']:.2f} s for the same "
                              f"texts: {made / ceiling['cpu']:.2f}x")
                print(f"round {r + 1}/{rounds}: ceiling {ceiling['rate'] / 1e3:.0f}k tokens/s, pipeline "
                      f"{p['tokens'] / p['wall'] / 1e3:.0f}k cold ({p['tokens'] / p['wall'] / ceiling['rate']:.2f}x), "
                      f"{p['warm']['tokens'] / p['warm']['wall'] / 1e3:.0f}k warm "
                      f"({p['warm']['tokens'] / p['warm']['wall'] / ceiling['rate']:.2f}x); "
                      f"first batch {p['first']:.2f} s, floor {floor['s']:.2f} s "
                      f"({p['first'] / floor['s']:.2f}x); load average {os.getloadavg()[0]:.1f}", flush=True)
        finally:
            limits.close()
        report(rows, single, single_cpu, stages, profiled, n_windows, load0, len(texts["all"]))


def report(rows, single, single_cpu, stages, profiled, n_windows, load0, n_docs) -> None:
    def rate(p: dict) -> float:
        return p["tokens"] / p["wall"]

    cold = [rate(r["pipe"]) / r["ceiling"]["rate"] for r in rows]
    warm = [rate(r["pipe"]["warm"]) / r["ceiling"]["rate"] for r in rows]
    firsts = [r["pipe"]["first"] / r["floor"]["s"] for r in rows]

    def per_cpu(p: dict, r: dict) -> float:  # tokens per CPU second against the ceiling's
        return (p["tokens"] / p["cpu"]) / (r["ceiling"]["tokens"] / r["ceiling"]["cpu"])

    cold_cpu = [per_cpu(r["pipe"], r) for r in rows]
    warm_cpu = [per_cpu(r["pipe"]["warm"], r) for r in rows]
    passes = [p for r in rows for p in (r["pipe"], r["pipe"]["warm"])]  # a baseline may deliver other data
    ok = all(p["sha"] == single["sha"] and p["batches"] == single["batches"] for p in passes)
    bases = [p for r in rows if r.get("base") for p in (r["base"], r["base"]["warm"])]
    same_base = len({(p["sha"], p["batches"]) for p in bases}) <= 1
    print()
    print(f"{'round':>5s} {'ceiling tok/s':>14s} {'cold tok/s':>11s} {'ratio':>6s} {'warm tok/s':>11s} {'ratio':>6s} "
          f"{'floor s':>8s} {'1st batch s':>12s} {'ratio':>6s} {'CPU cold':>9s} {'CPU warm':>9s} {'RSS MiB':>8s}")
    for i, r in enumerate(rows):
        p = r["pipe"]
        print(f"{i + 1:5d} {r['ceiling']['rate']:14,.0f} {rate(p):11,.0f} {cold[i]:6.2f} {rate(p['warm']):11,.0f} "
              f"{warm[i]:6.2f} {r['floor']['s']:8.2f} {p['first']:12.2f} {firsts[i]:6.2f} {p['cpu']:9.1f} "
              f"{p['warm']['cpu']:9.1f} {p['rss_mb']:8.0f}")
    total = sum(stages.values())
    print(f"\nCPU per window by stage (1-process loop, {profiled} windows, this thread; ms per window):")
    for name, s in sorted(stages.items(), key=lambda kv: -kv[1]):
        print(f"  {name:45s} {s / profiled * 1e3:8.1f} ms  {s / total:6.1%}")
    for name, key in (("cold", None), ("warm", "warm")):
        cpu = statistics.median(r["pipe"][key]["cpu"] if key else r["pipe"]["cpu"] for r in rows)
        print(f"whole {name} pass: pipeline {cpu:.1f} s CPU (median; every process) against the 1-process loop's "
              f"{single_cpu:.1f} s: {cpu / single_cpu:.2f}x, {(cpu - single_cpu) / n_windows * 1e3:+.0f} ms per window "
              + ("(the cluster's start, Dask's messages and serialization, the training process's batches)"
                 if key is None else "(Dask's messages and serialization, the training process's batches)"))
    for name, get in (("cold", lambda r: r["pipe"]), ("warm", lambda r: r["pipe"]["warm"])):
        parts = {k: statistics.median(get(r)["parts"].get(k, 0.0) for r in rows) for k in get(rows[0])["parts"]}
        print(f"{name} pass CPU by process and thread (medians, ms per window"
              + ("; the cluster's processes from their start" if name == "cold" else "") + "): "
              + ", ".join(f"{k} {v / n_windows * 1e3:.0f}" for k, v in parts.items() if v >= 0.005))
    for key, label in (("pipe", "this tree"), ("base", "baseline")):
        shares = [r[key]["shares"] for r in rows if key in r and "shares" in r[key]]
        if shares:
            print(f"where the cores went over the cold pass, {label} (share of cores x wall, per round):")
            for name in shares[0]:
                print(f"  {name:58s} " + ", ".join(f"{s.get(name, 0.0):6.1%}" for s in shares))
    print(f"batches byte-identical to the 1-process loop in every pass (sha256): {'YES' if ok else 'NO'} "
          f"[{single['sha'][:16]}, {single['batches']} batches]")
    if bases:
        print(f"the baseline's passes byte-identical to each other: {'YES' if same_base else 'NO'} "
              f"[{bases[0]['sha'][:16]}, {bases[0]['batches']} batches]")
    print(f"load average at the start {load0[0]:.1f}, at the end {os.getloadavg()[0]:.1f} "
          f"({os.cpu_count()} cores); ratios are per round, from passes side by side")
    print("targets (information only, never asserted):")
    print(f"  tokens/s >= {TARGET_CEILING:.2f}x the tokenizing ceiling: cold {', '.join(f'{x:.2f}x' for x in cold)}; "
          f"warm {', '.join(f'{x:.2f}x' for x in warm)}")
    print(f"  the same in tokens per CPU second (every process; on a busy machine the wall ratio measures the "
          f"share of the cores each mode got): cold {', '.join(f'{x:.2f}x' for x in cold_cpu)}; "
          f"warm {', '.join(f'{x:.2f}x' for x in warm_cpu)}")
    # the pass tokenizes every document of its plan (the ceiling's tokens, plus bos and eos each) and
    # delivers what its whole global steps hold (drop_last_step=True drops the lanes' surplus)
    tokenized, delivered = rows[0]["ceiling"]["tokens"] + 2 * n_docs, rows[0]["pipe"]["tokens"]
    kept = delivered / tokenized
    print(f"  the pass delivers {delivered:,} of the {tokenized:,} tokens it tokenizes ({1 - kept:.1%} dropped "
          f"at its end: every lane's batches after the last global step all lanes complete, and a pack's "
          f"remainder), so delivered tokens/s reach at most {kept:.2f}x the ceiling; tokens tokenized per second: "
          f"cold {', '.join(f'{x / kept:.2f}x' for x in cold)}; warm {', '.join(f'{x / kept:.2f}x' for x in warm)}")
    print(f"  first batch <= {TARGET_FLOOR:.1f}x its floor: {', '.join(f'{x:.2f}x' for x in firsts)} "
          f"(median {statistics.median(firsts):.2f}x)")
    if all("base" in r for r in rows):
        base = [r["base"]["first"] / r["floor"]["s"] for r in rows]
        theirs = ", ".join(f"{r['base']['first']:.3f}" for r in rows)
        ours = ", ".join(f"{r['pipe']['first']:.3f}" for r in rows)
        print(f"  the baseline's first batch against the same floors: {', '.join(f'{x:.2f}x' for x in base)} "
              f"(median {statistics.median(base):.2f}x; first batch {theirs} s against this tree's {ours} s)")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == PIPELINE_CHILD:
        rest = sys.argv[4:]
        pipeline_child(sys.argv[2], sys.argv[3], cores="--cores" in rest,
                       options=json.loads(rest[rest.index("--options") + 1]) if "--options" in rest else None)
    elif len(sys.argv) > 1 and sys.argv[1] == TIMELINE_CHILD:
        timeline_child(sys.argv[2], sys.argv[3])
    else:
        main()
