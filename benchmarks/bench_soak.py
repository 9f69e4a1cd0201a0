"""Soak: stream batches for a while on the embedded cluster and sample memory, fds and threads.

Samples the training process, the scheduler's process and every worker process (RSS,
memory in use through ``malloc``, Python's small objects alive and the pymalloc arenas
holding them, open file descriptors, threads; the windows held: in workers the task results,
in the training process the windows fetched ahead and those its lanes are cut from) at a
fixed interval while a repeating pipeline streams batches, then reports the change from the
end of the warm-up to the last sample, and for memory also between the means of the first
and last ``--span`` seconds after warm-up. Bounded state means flat curves after warm-up;
memory in use through ``malloc`` and Python objects alive that stay flat while RSS rises are
not arrays, buffers or objects piling up but memory freed and kept by an allocator. A
worker's results held are the windows computed ahead and not yet fetched (at most
``prefetch_windows`` in all): they move with how far the workers run ahead of the training
loop, so a worker's RSS less them is what shows state that grows. The training process holds
at most ``prefetch_windows`` windows fetched ahead and one a lane being cut: how many depends on
how far the cluster is ahead of the loop, so its RSS less them is what shows state that grows.

    python benchmarks/bench_soak.py --minutes 30 [--workers 2] [--every 10] [--warmup 360] [--span 300]
                                    [--csv soak.csv] [--png soak.png] [--quick]
    python benchmarks/bench_soak.py --plot soak.csv --png soak.png   # the curve of an earlier run
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path

import psutil

import zephon_dask as z
from zephon_dask.execution.memory import allocator_stats

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron".split()


@dataclass
class Sample:
    seconds: float
    batches: int
    rss_mb: dict[str, float]
    fds: dict[str, int]
    threads: dict[str, int]
    in_use_mb: dict[str, float]  # through malloc (glibc's mallinfo2); absent where unknown
    py_live_mb: dict[str, float]  # Python's small objects alive (pymalloc); absent where unknown
    py_arenas_mb: dict[str, float]  # pymalloc's arenas holding them; absent where unknown
    held_mb: dict[str, float]  # windows held: a worker's task results, the trainer's windows fetched or cut


def _corpus(root: Path, files: int = 4, docs: int = 500) -> str:
    import random

    rng = random.Random(0)
    root.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        with open(root / f"part-{f}.jsonl", "w") as fh:
            for i in range(docs):
                words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 200)))
                fh.write(json.dumps({"text": f"{f}/{i} {words}"}) + "\n")
    return str(root)


def _measure(procs: dict[str, psutil.Process]) -> tuple[dict, dict, dict]:
    rss, fds, threads = {}, {}, {}
    for name, p in procs.items():
        try:
            with p.oneshot():
                rss[name] = p.memory_info().rss / 2**20
                fds[name] = p.num_fds()
                threads[name] = p.num_threads()
        except psutil.NoSuchProcess:
            pass
    return rss, fds, threads


def _held_here(pipe) -> int | None:
    """Bytes of the windows the training process holds: fetched ahead and not taken, and those
    its lanes' batchers cut batches from (``None`` between two iterations)."""
    stream = pipe.session.stream
    if stream is None:
        return None
    return stream.fetcher.held_nbytes + sum(b.held_nbytes for b in list(stream.batchers.values()))


def _asked(client, pids: dict[str, str], pipe=None) -> tuple[dict[str, float], ...]:
    """Per process named in ``pids`` ("trainer", "scheduler", worker addresses), asked of each
    process itself: memory in use through ``malloc``, Python's small objects alive, pymalloc's
    arenas and the windows held (MB): a worker's task results, the training process's windows
    (of ``pipe``, when given)."""
    values = {"trainer": (*allocator_stats(), None if pipe is None else _held_here(pipe))}
    try:
        # a worker's results held: a window's result until the training process has fetched it
        # (as soon as it is computed); a lambda, so that it travels by value (this module is
        # not importable on the workers)
        values.update(client.run(lambda dask_worker: (*allocator_stats(), dask_worker.state.nbytes)))
        values["scheduler"] = (*client.run_on_scheduler(allocator_stats), None)
    except Exception:  # a process that is restarting: that sample has no value for it
        pass
    return tuple({name: values[key][i] / 2**20 for key, name in pids.items()
                  if key in values and values[key][i] is not None} for i in range(4))


def soak(seconds: float, every: float, n_workers: int = 1, workdir: str | None = None,
         rate: float | None = None) -> list[Sample]:
    """Stream a repeating pipeline on an embedded cluster for ``seconds``; a :class:`Sample` every
    ``every`` s. ``rate``: take at most that many batches a second, as a training loop slower than
    its data does (the windows computed ahead then stay at ``prefetch_windows``); ``None``: as
    fast as the pipeline gives them."""
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        ds = z.Dataset.from_jsonl("web", _corpus(Path(tmp) / "web"), progress=False)
        ws = z.MixtureWorkSource([ds], chunk_size=64, seed=0, exhausted_policy="repeat")
        pipe = (z.Pipeline(ws).tokenize().shuffle(64).pack(256).batch(4)
                .options(runner="distributed", n_workers=n_workers, canonical_replicas=4))
        samples: list[Sample] = []
        with pipe:
            batches = iter(pipe)
            next(batches)
            client = pipe.session.runner().client
            names = {"trainer": "trainer", "scheduler": "scheduler"}
            pids = {"trainer": os.getpid(), "scheduler": client.run_on_scheduler(os.getpid)}
            for i, (address, pid) in enumerate(sorted(client.run(os.getpid).items(), key=lambda kv: kv[1])):
                names[address], pids[f"worker-{i}"] = f"worker-{i}", pid
            procs = {name: psutil.Process(pid) for name, pid in pids.items()}
            start = time.monotonic()
            n, due = 1, start
            while True:
                now = time.monotonic()
                if now >= due:
                    samples.append(Sample(now - start, n, *_measure(procs), *_asked(client, names, pipe)))
                    due += every
                    if now - start >= seconds:
                        break
                next(batches)
                n += 1
                if rate and n % 64 == 0 and (ahead := start + n / rate - time.monotonic()) > 0:
                    time.sleep(ahead)
        return samples


def growth(samples: list[Sample], warmup: float, span: float = 0.0) -> dict[str, dict[str, float]]:
    """Per process: relative change of RSS and of memory in use (``nan`` where unknown) and
    absolute fd / thread change from the first sample after ``warmup`` seconds to the last one.
    With ``span`` > 0, memory compares the mean of the samples within ``span`` seconds after
    warm-up with the mean of the last ``span`` seconds (it moves by several MB from sample to
    sample as windows come and go)."""
    after = [s for s in samples if s.seconds >= warmup] or samples[-1:]
    first, last = after[0], samples[-1]
    head = [s for s in after if s.seconds <= first.seconds + span]
    tail = [s for s in after if s.seconds >= last.seconds - span]

    def mean(picked: list[Sample], name: str, field="rss_mb") -> float:
        """The mean of ``name``'s values under ``field`` (a Sample attribute, or a function of a Sample)."""
        get = field if callable(field) else attrgetter(field)
        values = [get(s)[name] for s in picked if name in get(s)]
        return sum(values) / len(values) if values else math.nan

    return {name: {"rss": mean(tail, name) / mean(head, name) - 1,
                   **{key: mean(tail, name, f"{key}_mb") / mean(head, name, f"{key}_mb") - 1
                      for key in ("in_use", "py_live", "py_arenas")},
                   "rss_less_held": mean(tail, name, _rss_less_held) / mean(head, name, _rss_less_held) - 1,
                   "fds": last.fds[name] - first.fds[name],
                   "threads": last.threads[name] - first.threads[name]}
            for name in first.rss_mb if name in last.rss_mb}


def read_csv(path: str) -> list[Sample]:
    """The samples of a ``--csv`` file."""
    import csv

    with open(path) as fh:
        rows = list(csv.DictReader(fh))
    names = sorted({k[: -len("_rss_mb")] for k in rows[0] if k.endswith("_rss_mb")})
    return [Sample(float(r["seconds"]), int(r["batches"]),
                   {n: float(r[f"{n}_rss_mb"]) for n in names}, {n: int(r[f"{n}_fds"]) for n in names},
                   {n: int(r[f"{n}_threads"]) for n in names},
                   *({n: float(r[f"{n}_{key}_mb"]) for n in names if r.get(f"{n}_{key}_mb")}
                     for key in ("in_use", "py_live", "py_arenas", "held"))) for r in rows]


def _rss_less_held(s: Sample) -> dict[str, float]:
    """Per process that holds windows, RSS less the windows it holds (MB)."""
    return {name: s.rss_mb[name] - held for name, held in s.held_mb.items() if name in s.rss_mb}


def plot(samples: list[Sample], warmup: float, png: str) -> None:
    """Per process over time, warm-up marked: RSS (solid; less the windows it holds: dashed),
    memory in use through malloc (solid) and the windows it holds (dashed), Python's small objects
    (alive: solid; pymalloc's arenas: dashed), fds and threads; a small PNG (matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [s.seconds / 60 for s in samples]
    fig, axes = plt.subplots(5, 1, figsize=(7, 10), sharex=True, dpi=72)
    panels = [("RSS; less windows\nheld (MB)", (attrgetter("rss_mb"), _rss_less_held)),
              ("in use via malloc,\nwindows held (MB)", (attrgetter("in_use_mb"), attrgetter("held_mb"))),
              ("Python small objects:\nalive, arenas (MB)", (attrgetter("py_live_mb"), attrgetter("py_arenas_mb"))),
              ("open fds", (attrgetter("fds"),)), ("threads", (attrgetter("threads"),))]
    for ax, (label, getters) in zip(axes, panels, strict=True):
        for i, name in enumerate(sorted(samples[0].rss_mb)):
            for get, style in zip(getters, ("-", "--"), strict=False):
                ax.plot(minutes, [get(s).get(name, float("nan")) for s in samples], style,
                        color=f"C{i}", label=name if style == "-" else None, lw=1.2)
        ax.axvline(warmup / 60, color="grey", ls="--", lw=0.8)
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0].legend(loc="lower right", fontsize=8, ncol=3)
    axes[0].set_title(f"soak: {samples[-1].batches:,} batches in {samples[-1].seconds / 60:.0f} min "
                      "(grey: end of warm-up)", fontsize=10)
    axes[-1].set_xlabel("minutes")
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)


def table(samples: list[Sample], rows: int = 7) -> str:
    """A markdown table of ``rows`` samples evenly spread over the run (first and last included):
    per process, ``RSS MB (in use through malloc + Python's small objects alive / pymalloc's arenas,
    MB) / fds / threads``."""
    names = sorted(samples[0].rss_mb)
    end = samples[-1].seconds
    picks = [min(samples, key=lambda s, t=end * i / (rows - 1): abs(s.seconds - t)) for i in range(rows)]
    out = ["| min | batches | " + " | ".join(names) + " |", "|---:|---:|" + "---|" * len(names)]
    for s in picks:
        cells = [f"{s.rss_mb[n]:.1f} MB ({s.in_use_mb.get(n, math.nan):.1f} + {s.py_live_mb.get(n, math.nan):.1f}"
                 f" / {s.py_arenas_mb.get(n, math.nan):.1f}) / {s.fds[n]} / {s.threads[n]}"
                 if n in s.rss_mb else "-" for n in names]
        out.append(f"| {s.seconds / 60:.1f} | {s.batches:,} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=1.0)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--every", type=float, default=10.0, help="seconds between samples")
    ap.add_argument("--warmup", type=float, default=None, help="seconds of warm-up (default: a tenth)")
    ap.add_argument("--span", type=float, default=None,
                    help="seconds averaged at each end for the RSS change (default: 300, at most a quarter of the rest)")
    ap.add_argument("--rate", type=float, default=None,
                    help="batches a second at most, as a training loop slower than its data (default: as fast as it can)")
    ap.add_argument("--csv", help="write every sample here")
    ap.add_argument("--quick", action="store_true", help="20 s, a sample every 2 s")
    ap.add_argument("--png", help="plot the curves here (needs matplotlib)")
    ap.add_argument("--plot", metavar="CSV", help="no run: report and plot the samples of an earlier --csv")
    args = ap.parse_args()
    if args.quick:
        args.minutes, args.every = 1 / 3, 2.0
    if args.plot:
        samples = read_csv(args.plot)
        seconds = samples[-1].seconds
    else:
        seconds = args.minutes * 60
        samples = soak(seconds, args.every, args.workers, rate=args.rate)
    if args.csv and not args.plot:
        names = sorted(samples[0].rss_mb)
        with open(args.csv, "w") as fh:
            fh.write("seconds,batches,"
                     + ",".join(f"{n}_rss_mb,{n}_fds,{n}_threads,{n}_in_use_mb,{n}_py_live_mb,{n}_py_arenas_mb,"
                                f"{n}_held_mb" for n in names) + "\n")
            for s in samples:
                cols = [f"{s.rss_mb.get(n, 0):.1f},{s.fds.get(n, 0)},{s.threads.get(n, 0)},"
                        + ",".join(f"{values[n]:.1f}" if n in values else ""
                                   for values in (s.in_use_mb, s.py_live_mb, s.py_arenas_mb, s.held_mb))
                        for n in names]
                fh.write(f"{s.seconds:.1f},{s.batches}," + ",".join(cols) + "\n")
    warmup = args.warmup if args.warmup is not None else seconds / 10
    if args.png:
        plot(samples, warmup, args.png)
    print(table(samples))
    print(f"{samples[-1].batches:,} batches in {samples[-1].seconds:.0f} s; change after {warmup:.0f} s of warm-up:")
    span = args.span if args.span is not None else min(300.0, (seconds - warmup) / 4)
    means = growth(samples, warmup, span)
    for name, g in growth(samples, warmup).items():
        s0 = next(s for s in samples if s.seconds >= warmup or s is samples[-1])
        print(f"  {name:10s} RSS {s0.rss_mb[name]:7.1f} -> {samples[-1].rss_mb[name]:7.1f} MB ({g['rss']:+.1%}; "
              f"{span:.0f}-s means {means[name]['rss']:+.1%}; in use via malloc {means[name]['in_use']:+.1%}, "
              f"Python objects alive {means[name]['py_live']:+.1%}, arenas {means[name]['py_arenas']:+.1%}"
              + (f"; RSS less windows held {means[name]['rss_less_held']:+.1%}"
                 if not math.isnan(means[name]["rss_less_held"]) else "") + "), "
              f"fds {g['fds']:+d}, threads {g['threads']:+d}")


if __name__ == "__main__":
    main()
