"""Scale: what one consumer and one scheduler cost as lanes and workers grow, on one machine.

Each configuration runs the pipeline over a small JSONL corpus (real files in a
temporary directory) with ``canonical_replicas`` lanes, on a user-provided
``Client`` of a cluster of three processes: a Dask scheduler alone, ``W``
one-thread workers sharing one process (threads, so that one small machine can
hold 64 of them), and this training loop. Windows are small (16 documents, a
few ms of work: read + byte tokenizer + ``pack(256)``), so the control plane's
cost per window is large next to the work, as on a big cluster with small
windows. Figures per configuration, over the run after its first batch:

* **consumer us/batch**: CPU time of the training thread inside ``next()``
  (``time.thread_time``), per batch: choosing the lane, cutting the batch,
  submitting the next windows, taking results. Hashing the batch is outside.
* **client us/win**: CPU of this process's Dask event-loop threads (receiving
  and deserialising windows, talking to the scheduler) per window.
* **sched us/win**: CPU of the scheduler process per window finished (all of
  it, heartbeats included; ``(idle)`` is its CPU with no work, timed before
  the run); **workers us/win** the same for the workers' process (the windows'
  work and the workers' messaging).
* **tasks us/win** and **ctl us/win**: the workers' CPU split into their
  task threads (the windows' own work) and the rest (their event loops:
  messages, transitions, transfers); the control plane per window is then the
  client loop + the scheduler + the workers' rest (``ctl``), and its
  inverse the windows/s one scheduler core could serve (``1/sched``).
  **net us/win**: ``ctl`` less what the scheduler's and the workers' processes
  cost with no work at all (their ``(idle)`` cores, timed before the run, times
  the run's wall time): heartbeats and ticks cost per second, not per window,
  so on a slow machine (fewer windows a second) they weigh more on ``ctl``.
* **win/s**: windows finished per second of wall time (the scheduler's
  transitions to ``memory``, counted by a scheduler plugin).
* **w/task**: windows per Dask task at the run's end (``auto:N``: the automatic
  choice, which starts at 1 and is made as windows are taken), with
  ``--windows-per-task auto,1`` each configuration run with each, one after the other.
* **in flight**: the most window tasks the scheduler held at once during the
  run (submitted and not yet released: waiting, queued, processing or in
  memory), against ``prefetch_windows``, and the most bytes of finished
  windows held on workers (the scheduler's ``nbytes``).
* **cores / busy**: CPU per second of wall time of the scheduler, the workers,
  the training thread, and of the rest of the machine (other processes: the
  machine may be shared).

Every run hashes the ``tokens`` array of each batch (sha256, delivery order)
and compares the first ``--check`` batches with the same pipeline on the
``synchronous`` runner (windows computed in this thread, no Dask). ``--ramp``
then shrinks the windows (16 documents down to 1) at 256 lanes and the fewest
workers, to find where windows/s stops growing and what saturates.
Nothing asserts a time.

    python benchmarks/bench_scale.py [--quick] [--lanes 64,256,1024] [--workers 16,32,64]
                                     [--windows-per-task auto,1] [--direct]
                                     [--ramp] [--png docs/scale.png] [--csv scale.csv]
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import hashlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import dask
import numpy as np
import psutil
from distributed import Client
from distributed.diagnostics.plugin import SchedulerPlugin

import zephon_dask as z
from zephon_dask.execution.cluster import embedded_config

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron".split()
SHARDS = 8
SEQ_LEN = 256
MICROBATCH = 16
CHUNK_SIZE = 8  # documents per chunk
FLUSH_K = 2  # chunks per window: 16 documents, ~22 rows of 256 tokens, a few ms of work
WINDOW_PREFIXES = ("zephon-fused-window-", "zephon-window-", "zephon-windows-")
RAMP_BATCHES = 384  # batches per run of --ramp
IDLE_S = 2.0  # seconds the idle scheduler and workers are timed before each run
HERE = os.path.abspath(__file__)
SCHEDULER_FLAG, WORKERS_FLAG = "--_scheduler", "--_workers"


# -- corpus and pipeline ------------------------------------------------------------------------


def write_corpus(root: str, docs: int, seed: int = 0) -> None:
    """``docs`` documents of 20-120 words in ``SHARDS`` JSONL files under ``root``."""
    rng = np.random.default_rng(seed)
    words = np.array(WORDS)
    per = -(-docs // SHARDS)
    for s in range(SHARDS):
        lengths = rng.integers(20, 120, per)
        idx = rng.integers(0, len(words), int(lengths.sum()))
        cuts = np.cumsum(lengths)[:-1]
        with open(os.path.join(root, f"part-{s:02d}.jsonl"), "w", encoding="utf-8") as f:
            for i, doc in enumerate(np.split(words[idx], cuts)):
                f.write(json.dumps({"id": f"{s}/{i}", "text": " ".join(doc.tolist())}) + "\n")


def build(data_dir: str, lanes: int, chunk_size: int = CHUNK_SIZE, flush_k: int = FLUSH_K) -> z.Pipeline:
    ds = z.Dataset.from_jsonl("corpus", data_dir, progress=False)
    source = z.MixtureWorkSource([ds], chunk_size=chunk_size, seed=0)
    return (z.Pipeline(source).tokenize().pack(SEQ_LEN).batch(MICROBATCH)
            .options(canonical_replicas=lanes, flush_every_k_chunks=flush_k))


def docs_needed(lanes: int, batches: int, chunk_size: int, flush_k: int) -> int:
    """Documents enough that no lane ends before ``batches`` batches: counting one row per document
    (there are ~1.4), two windows more per lane, and twice that."""
    windows_per_lane = -(-batches // lanes) * MICROBATCH // max(1, chunk_size * flush_k) + 2
    return 2 * lanes * windows_per_lane * chunk_size * flush_k


class Tally:
    """The running sha256 of every batch's ``tokens`` array, and the digest after ``check`` batches."""

    def __init__(self, check: int):
        self.sha, self.check, self.batches, self.check_sha = hashlib.sha256(), check, 0, None

    def add(self, batch) -> None:
        tokens = np.ascontiguousarray(batch["tokens"])
        self.sha.update(str(tokens.shape).encode())
        self.sha.update(tokens.tobytes())
        self.batches += 1
        if self.batches == self.check:
            self.check_sha = self.sha.hexdigest()


def reference_sha(pipe: z.Pipeline, check: int) -> str:
    """sha256 of the first ``check`` batches on the synchronous runner (no Dask)."""
    tally = Tally(check)
    with pipe.options(runner="synchronous", session_client=False) as ref:
        for batch in ref:
            tally.add(batch)
            if tally.batches == check:
                break
    return tally.check_sha


# -- what is measured ---------------------------------------------------------------------------


class WindowsInFlight(SchedulerPlugin):
    """Counts the scheduler's window tasks: held now (submitted, not yet released), the most held
    at once, the bytes of finished ones held, and how many finished. Runs on the event loop."""

    name = "bench-scale-windows-in-flight"

    def __init__(self, scheduler):
        self.scheduler = scheduler
        self.live: set = set()
        self.nbytes: dict = {}
        self.held_bytes = self.max_live = self.max_bytes = self.finished = 0

    def reset_peaks(self) -> None:
        self.max_live, self.max_bytes = len(self.live), self.held_bytes

    def transition(self, key, start, finish, *args, **kwargs) -> None:
        if not isinstance(key, str) or not key.startswith(WINDOW_PREFIXES):
            return
        if finish in ("released", "forgotten", "erred"):
            self.live.discard(key)
            self.held_bytes -= self.nbytes.pop(key, 0)
            return
        self.live.add(key)
        self.max_live = max(self.max_live, len(self.live))
        if finish == "memory":  # a task of several windows (zephon-windows-...) names each one
            self.finished += len(key.split("-")[3:]) if key.startswith("zephon-windows-") else 1
            ts = self.scheduler.tasks.get(key)
            nbytes = max(0, ts.nbytes) if ts is not None else 0
            self.held_bytes += nbytes - self.nbytes.get(key, 0)
            self.nbytes[key] = nbytes
            self.max_bytes = max(self.max_bytes, self.held_bytes)


def thread_cpu() -> dict[int, tuple[str, float]]:
    """CPU seconds of every live thread of this process (its own CPU clock), by ident."""
    out = {}
    for t in threading.enumerate():
        try:
            out[t.ident] = (t.name, time.clock_gettime(time.pthread_getcpuclockid(t.ident)))
        except (OSError, TypeError, ProcessLookupError):  # a thread that just ended
            pass
    return out


def loop_cpu(before: dict, after: dict) -> float:
    """CPU seconds the client's event-loop threads used between two :func:`thread_cpu` snapshots."""
    return sum(cpu - before.get(ident, (name, 0.0))[1] for ident, (name, cpu) in after.items()
               if name == "IO loop" or name.startswith("Dask-Offload"))


def worker_threads_cpu() -> tuple[float, float]:
    """Run on a worker: ``(CPU seconds of the task threads of every worker in its process, of all its
    other threads)`` so far (the workers' process: one event loop, a task thread per worker)."""
    tasks = rest = 0.0
    for name, cpu in thread_cpu().values():
        if "Dask-Default-Threads" in name:
            tasks += cpu
        else:
            rest += cpu
    return tasks, rest


def proc_cpu(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def machine_busy() -> float | None:
    """Busy CPU seconds of the whole machine so far (``/proc/stat``), or ``None``."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def plugin_counts(dask_scheduler) -> tuple[int, int, int, int]:
    """(windows finished, held now, most held since the last call, most bytes held since then)."""
    plugin = dask_scheduler.plugins[WindowsInFlight.name]
    out = (plugin.finished, len(plugin.live), plugin.max_live, plugin.max_bytes)
    plugin.reset_peaks()
    return out


# -- the cluster: a scheduler process and a process of thread workers ------------------------------


async def serve_scheduler() -> None:
    """Child: a scheduler on 127.0.0.1 with :class:`WindowsInFlight`; prints its address, runs until killed."""
    from distributed import Scheduler

    async with Scheduler(host="127.0.0.1", port=0, dashboard=False, dashboard_address="127.0.0.1:0") as scheduler:
        scheduler.add_plugin(WindowsInFlight(scheduler))
        print(scheduler.address, flush=True)
        await scheduler.finished()


async def serve_workers(address: str, n: int) -> None:
    """Child: ``n`` one-thread workers on one event loop; prints ``ready``, runs until killed."""
    from distributed import Worker

    workers = [Worker(address, nthreads=1, host="127.0.0.1", dashboard=False, memory_limit=0)
               for _ in range(n)]
    await asyncio.gather(*workers)
    print("ready", flush=True)
    await asyncio.gather(*(w.finished() for w in workers))


def _child(argv: list[str]) -> None:
    logging.getLogger("distributed").setLevel(logging.ERROR)
    with dask.config.set(embedded_config()):  # the library's quieter housekeeping intervals
        if argv[0] == SCHEDULER_FLAG:
            asyncio.run(serve_scheduler())
        else:
            asyncio.run(serve_workers(argv[1], int(argv[2])))


@contextmanager
def cluster(workers: int, direct: bool) -> Iterator[tuple[Client, psutil.Process, psutil.Process]]:
    """A scheduler process and a process of ``workers`` thread workers, and a client that fetches
    results from the workers (``direct``) or through the scheduler (Dask's default); stops both."""
    procs: list[subprocess.Popen] = []
    try:
        procs.append(subprocess.Popen([sys.executable, HERE, SCHEDULER_FLAG], stdout=subprocess.PIPE, text=True))
        address = procs[0].stdout.readline().strip()
        procs.append(subprocess.Popen([sys.executable, HERE, WORKERS_FLAG, address, str(workers)],
                                      stdout=subprocess.PIPE, text=True))
        if procs[1].stdout.readline().strip() != "ready":
            raise SystemExit("the workers' process failed to start")
        with Client(address, set_as_default=False, direct_to_workers=direct) as client:
            client.wait_for_workers(workers, timeout=60)
            yield client, psutil.Process(procs[0].pid), psutil.Process(procs[1].pid)
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)


@dataclass
class Result:
    lanes: int
    workers: int
    direct: bool
    docs_per_window: int
    option: str
    windows_per_task: int
    prefetch: int
    batches: int
    windows: int
    wall_s: float
    first_batch_s: float
    windows_per_s: float
    consumer_us_per_batch: float
    client_loop_us_per_window: float
    scheduler_us_per_window: float
    workers_us_per_window: float
    tasks_us_per_window: float
    control_us_per_window: float
    net_control_us_per_window: float
    scheduler_cores: float
    scheduler_idle_cores: float
    workers_cores: float
    workers_idle_cores: float
    consumer_busy: float
    other_cores: float | None
    max_in_flight: int
    max_in_flight_mb: float
    sha_ok: bool


def run_config(data_dir: str, lanes: int, workers: int, batches: int, check: int, ref_sha: str,
               chunk_size: int = CHUNK_SIZE, flush_k: int = FLUSH_K, direct: bool = False,
               idle_s: float = IDLE_S, windows_per_task: int | None = None) -> Result:
    """One pass of ``batches`` batches; figures over all but the first batch (see the module docstring).
    ``windows_per_task``: the option (``None``: its default, automatic)."""
    with cluster(workers, direct) as (client, scheduler, worker_proc):
        idle0, workers_idle0, t = proc_cpu(scheduler), proc_cpu(worker_proc), time.perf_counter()
        time.sleep(idle_s)
        span = max(1e-9, time.perf_counter() - t)
        idle, workers_idle = (proc_cpu(scheduler) - idle0) / span, (proc_cpu(worker_proc) - workers_idle0) / span
        pipe = build(data_dir, lanes, chunk_size, flush_k).options(client=client)
        pipe = pipe.options(windows_per_task=windows_per_task)
        one = [sorted(client.scheduler_info()["workers"])[0]]
        tally, consumer = Tally(check), 0.0
        with pipe:
            client.run_on_scheduler(plugin_counts)  # peaks from here
            t_start = time.perf_counter()
            it = iter(pipe)
            tally.add(next(it))
            first = time.perf_counter() - t_start
            done0 = client.run_on_scheduler(plugin_counts)[0]
            sched0, work0, threads0, busy0 = proc_cpu(scheduler), proc_cpu(worker_proc), thread_cpu(), machine_busy()
            (tasks0, _), = client.run(worker_threads_cpu, workers=one).values()
            proc0, t0 = time.process_time(), time.perf_counter()
            for _ in range(batches - 1):
                c = time.thread_time()
                batch = next(it)
                consumer += time.thread_time() - c
                tally.add(batch)
            wall = time.perf_counter() - t0
            fetcher = pipe.session.stream.fetcher  # windows per task and prefetch as they ended
            per_task, prefetch = fetcher.windows_per_task, fetcher.prefetch
            (tasks1, _), = client.run(worker_threads_cpu, workers=one).values()
            sched, work = proc_cpu(scheduler) - sched0, proc_cpu(worker_proc) - work0
            client_loop, proc, busy1 = loop_cpu(threads0, thread_cpu()), time.process_time() - proc0, machine_busy()
            done1, _, max_live, max_bytes = client.run_on_scheduler(plugin_counts)
    windows = done1 - done0
    other = None if busy0 is None or busy1 is None else max(0.0, (busy1 - busy0) - proc - sched - work) / wall
    n = max(1, windows)
    tasks = tasks1 - tasks0
    control = (client_loop + sched + work - tasks) / n * 1e6
    return Result(
        lanes=lanes, workers=workers, direct=direct, docs_per_window=chunk_size * flush_k,
        option="auto" if windows_per_task is None else str(windows_per_task), windows_per_task=per_task,
        prefetch=prefetch,
        batches=batches - 1, windows=windows, wall_s=wall, first_batch_s=first, windows_per_s=windows / wall,
        consumer_us_per_batch=consumer / (batches - 1) * 1e6, client_loop_us_per_window=client_loop / n * 1e6,
        scheduler_us_per_window=sched / n * 1e6, workers_us_per_window=work / n * 1e6,
        tasks_us_per_window=tasks / n * 1e6, control_us_per_window=control,
        net_control_us_per_window=max(0.0, control - (idle + workers_idle) * wall / n * 1e6),
        scheduler_cores=sched / wall, scheduler_idle_cores=idle, workers_cores=work / wall,
        workers_idle_cores=workers_idle,
        consumer_busy=consumer / wall, other_cores=other, max_in_flight=max_live,
        max_in_flight_mb=max_bytes / 1e6, sha_ok=tally.check_sha is not None and tally.check_sha == ref_sha,
    )


# -- report -------------------------------------------------------------------------------------

COLUMNS = (  # (title, unit, width, format of a Result)
    ("lanes", "", 5, lambda r: f"{r.lanes}"),
    ("wkrs", "", 4, lambda r: f"{r.workers}"),
    ("via", "", 5, lambda r: "wkrs" if r.direct else "sched"),
    ("docs/w", "", 6, lambda r: f"{r.docs_per_window}"),
    ("w/task", "", 7, lambda r: f"{r.windows_per_task}" if r.option == str(r.windows_per_task)
     else f"{r.option}:{r.windows_per_task}"),
    ("batches", "", 7, lambda r: f"{r.batches}"),
    ("windows", "", 7, lambda r: f"{r.windows}"),
    ("win/s", "", 6, lambda r: f"{r.windows_per_s:.0f}"),
    ("consumer", "us/batch", 8, lambda r: f"{r.consumer_us_per_batch:.0f}"),
    ("client", "us/win", 6, lambda r: f"{r.client_loop_us_per_window:.0f}"),
    ("sched", "us/win", 6, lambda r: f"{r.scheduler_us_per_window:.0f}"),
    ("workers", "us/win", 7, lambda r: f"{r.workers_us_per_window:.0f}"),
    ("tasks", "us/win", 6, lambda r: f"{r.tasks_us_per_window:.0f}"),
    ("ctl", "us/win", 6, lambda r: f"{r.control_us_per_window:.0f}"),
    ("net", "us/win", 6, lambda r: f"{r.net_control_us_per_window:.0f}"),
    ("1/sched", "win/s", 7, lambda r: f"{1e6 / max(1.0, r.scheduler_us_per_window):.0f}"),
    ("sched", "cores", 5, lambda r: f"{r.scheduler_cores:.2f}"),
    ("(idle)", "cores", 6, lambda r: f"{r.scheduler_idle_cores:.2f}"),
    ("wkrs", "cores", 5, lambda r: f"{r.workers_cores:.2f}"),
    ("(idle)", "cores", 6, lambda r: f"{r.workers_idle_cores:.2f}"),
    ("cons", "busy", 5, lambda r: f"{r.consumer_busy:.0%}"),
    ("in flight", "max/pref", 9, lambda r: f"{r.max_in_flight}/{r.prefetch}"),
    ("held", "MB", 5, lambda r: f"{r.max_in_flight_mb:.1f}"),
    ("other", "cores", 5, lambda r: "?" if r.other_cores is None else f"{r.other_cores:.2f}"),
    ("sha", "", 3, lambda r: "ok" if r.sha_ok else "NO"),
)


def header() -> str:
    return "\n".join(" ".join(f"{c[i]:>{c[2]}s}" for c in COLUMNS) for i in (0, 1))


def row(r: Result) -> str:
    return " ".join(f"{c[3](r):>{c[2]}s}" for c in COLUMNS)


def plot(results: list[Result], ramp: list[Result], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3 if ramp else 2, figsize=(15 if ramp else 10, 4))
    for i, w in enumerate(sorted({r.workers for r in results})):
        rs = sorted((r for r in results if r.workers == w), key=lambda r: r.lanes)
        x = [r.lanes for r in rs]
        axes[0].plot(x, [r.consumer_us_per_batch for r in rs], "o-", color=f"C{i}", label=f"{w} workers")
        axes[1].plot(x, [r.scheduler_us_per_window for r in rs], "o-", color=f"C{i}", label=f"{w} workers")
    axes[0].set(xscale="log", xlabel="lanes (canonical_replicas)", ylabel="CPU us per batch",
                title="training thread, per batch", ylim=(0, None))
    axes[1].set(xscale="log", xlabel="lanes (canonical_replicas)", ylabel="CPU us per window",
                title="scheduler process, per window", ylim=(0, None))
    for ax in axes[:2]:
        ax.set_xticks(sorted({r.lanes for r in results}), [str(n) for n in sorted({r.lanes for r in results})])
        ax.legend(fontsize=8)
    if ramp:
        rs = sorted(ramp, key=lambda r: r.docs_per_window)
        x = [r.docs_per_window for r in rs]
        ax = axes[2]
        ax.plot(x, [r.windows_per_s for r in rs], "o-", color="k", label="windows/s")
        ax.set(xscale="log", xlabel="documents per window", ylabel="windows/s",
               title=f"smaller windows: {rs[0].lanes} lanes, {rs[0].workers} workers", ylim=(0, None))
        ax.set_xticks(x, [str(v) for v in x])
        ax2 = ax.twinx()
        for key, label, style in (("scheduler_cores", "scheduler", "s--"), ("workers_cores", "workers", "^--"),
                                  ("consumer_busy", "consumer thread", "v--")):
            ax2.plot(x, [getattr(r, key) for r in rs], style, label=label)
        ax2.set(ylabel="cores busy", ylim=(0, None))
        ax.legend(loc="upper left", fontsize=8)
        ax2.legend(loc="upper right", fontsize=8)
    others = [r.other_cores for r in results + ramp if r.other_cores is not None]
    if others:
        fig.suptitle(f"{os.cpu_count()} cores; other processes used {min(others):.2f}-{max(others):.2f} "
                     "cores meanwhile", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def parse_ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse_sizes(text: str) -> list[int | None]:
    """``windows_per_task`` values: integers, ``auto`` for ``None``."""
    return [None if x.strip() == "auto" else int(x) for x in text.split(",") if x.strip()]


def main(argv=None) -> list[Result]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="lanes 16,64 and workers 4,8, fewer batches")
    ap.add_argument("--lanes", type=parse_ints, default=None, help="canonical_replicas to run (default 64,256,1024)")
    ap.add_argument("--workers", type=parse_ints, default=None, help="thread workers (default 16,32,64)")
    ap.add_argument("--batches", type=int, default=None,
                    help="batches per run (default: max(2 x lanes, 768); --quick: max(lanes, 128))")
    ap.add_argument("--check", type=int, default=256, help="batches compared with the synchronous runner")
    ap.add_argument("--ramp", action="store_true",
                    help=f"then shrink the windows (16 documents down to 1), {RAMP_BATCHES} batches each, at 256 "
                         "lanes (or the most) and the fewest workers")
    ap.add_argument("--direct", action="store_true",
                    help="fetch results from the workers (Client(direct_to_workers=True)), not through the scheduler")
    ap.add_argument("--windows-per-task", type=parse_sizes, default=[None],
                    help="the windows_per_task option, or several (e.g. auto,1: each configuration with each, "
                         "one after the other); default: auto, the option's default")
    ap.add_argument("--png", default=None, help="draw the curves here (needs matplotlib)")
    ap.add_argument("--csv", default=None, help="write every row here")
    args = ap.parse_args(argv)
    lanes_list = args.lanes or ([16, 64] if args.quick else [64, 256, 1024])
    workers_list = args.workers or ([4, 8] if args.quick else [16, 32, 64])

    def batches_for(lanes: int) -> int:
        return args.batches or (max(lanes, 128) if args.quick else max(2 * lanes, 768))

    ramp_sizes = [(8, 1), (4, 1), (2, 1), (1, 1)] if args.ramp else []
    results: list[Result] = []
    ramp: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="zephon-bench-scale-") as tmp:
        docs = max([docs_needed(n, batches_for(n), CHUNK_SIZE, FLUSH_K) for n in lanes_list]
                   + [docs_needed(n, RAMP_BATCHES, c, k) for n in lanes_list for c, k in ramp_sizes])
        t = time.perf_counter()
        write_corpus(tmp, docs)
        print(f"corpus: {docs:,} documents of 20-120 words in {SHARDS} JSONL files, written in "
              f"{time.perf_counter() - t:.1f} s; work: byte tokenizer + pack({SEQ_LEN}) + batch({MICROBATCH}); "
              f"{os.cpu_count()} cores; processes: scheduler, thread workers, this training loop")
        print(header(), flush=True)
        for lanes in lanes_list:
            check = min(args.check, batches_for(lanes))
            ref = reference_sha(build(tmp, lanes), check)
            for workers in workers_list:
                for size in args.windows_per_task:
                    results.append(run_config(tmp, lanes, workers, batches_for(lanes), check, ref,
                                              direct=args.direct, windows_per_task=size))
                    print(row(results[-1]), flush=True)
        if ramp_sizes:
            lanes = 256 if 256 in lanes_list else max(lanes_list)
            workers = min(workers_list)
            print(f"\nsmaller windows: {lanes} lanes, {workers} workers")
            print(header(), flush=True)
            for chunk_size, flush_k in [(CHUNK_SIZE, FLUSH_K), *ramp_sizes]:
                check = min(args.check, RAMP_BATCHES)
                ref = reference_sha(build(tmp, lanes, chunk_size, flush_k), check)
                for size in args.windows_per_task:
                    ramp.append(run_config(tmp, lanes, workers, RAMP_BATCHES, check, ref, chunk_size, flush_k,
                                           direct=args.direct, windows_per_task=size))
                    print(row(ramp[-1]), flush=True)
    everything = results + ramp
    print(f"\nbatches byte-identical to the synchronous runner (first {args.check}, or all) in every run: "
          f"{'YES' if all(r.sha_ok for r in everything) else 'NO'}")
    # +2: a window asked for out of turn is submitted before the one taken is released, and Dask
    # delivers a release to the scheduler after the next submission
    print(f"windows held by the scheduler never above prefetch_windows + 2: "
          f"{'YES' if all(r.max_in_flight <= r.prefetch + 2 for r in everything) else 'NO'}")
    others = [r.other_cores for r in everything if r.other_cores is not None]
    if others:
        print(f"other processes used {min(others):.2f}-{max(others):.2f} of the {os.cpu_count()} cores meanwhile")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(asdict(everything[0])))
            writer.writeheader()
            writer.writerows(asdict(r) for r in everything)
    if args.png:
        first = "auto" if args.windows_per_task[0] is None else str(args.windows_per_task[0])
        try:
            plot([r for r in results if r.option == first], [r for r in ramp if r.option == first], args.png)
            print(f"curves: {args.png}")
        except ImportError:
            print("matplotlib is not installed: no PNG")
    return everything


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in (SCHEDULER_FLAG, WORKERS_FLAG):
        _child(sys.argv[1:])
    else:
        main()
