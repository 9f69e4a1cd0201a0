"""What a short run pays for the embedded cluster it barely uses, and how fast a fault ends a run.

Each case runs real processes (training scripts as subprocesses, ``dask scheduler`` and
``dask worker`` processes on 127.0.0.1) and prints medians over ``--repeat`` runs:

* ``quickstart``: the quickstart's script (docs/quickstart.md, 8 batches) on the default runner
  and on ``threads``, in the same run: the process's wall time, its exit after the last batch,
  and the difference between the two runners.
* ``cli``: ``zephon-dask run examples/recipe.toml --steps 40``, both runners: wall time.
* ``help``: ``zephon-dask --help`` against a bare interpreter: what the CLI adds to startup.
* ``error``: a wrong ``text_field`` on the default runner, the error left uncaught and the
  pipeline never closed: the exit after the error, and the lines printed.
* ``scheduler``: the scheduler of a ``dask scheduler`` + ``dask worker`` cluster killed mid-stream
  (``cluster_timeout`` 10 s), the error left uncaught: the error after the kill, the exit after it.
* ``lost``: every worker of a 2-worker cluster killed while finished results are held
  (``cluster_timeout`` 10 s): the error after the kill, the training process's CPU meanwhile (% of
  one core), and its waits and liveness RPCs per second.
* ``frozen``: one of 2 workers stopped (``SIGSTOP``) for the rest of the run (``--stall`` s of
  ``stall_timeout``): the first batch after the freeze, the longest gap between batches, and
  whether the batches equal an uninterrupted run's.
* ``start``: the embedded cluster's start in a fresh training process (torch imported first, as a
  training script does), quiet and under load (one busy process per core started beside it),
  alternately: the time to a ready cluster (``local_cluster`` until its client sees every
  worker), the scheduler's share of it, the fresh interpreters the cluster started (each imports
  ``distributed``; processes forked from one count once), and in the quickstart's pipeline the
  first batch against the moment its cluster was ready (the head start computes the first windows
  meanwhile). With ``--baseline DIR`` (a source tree of another version, e.g. from
  ``git archive main | tar -x -C DIR``), its runs alternate with this tree's.

    python benchmarks/bench_exit.py [--repeat 3] [--stall 5] [--cases quickstart,cli,error,...] [--quick]
                                    [--baseline DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repository: tests.helpers

from tests.helpers.clusters import dask_cluster  # noqa: E402

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron".split()

QUICKSTART = """
import sys, time
import zephon_dask as z

prose = z.Dataset.from_jsonl("prose", "examples/data/prose.jsonl")
code = z.Dataset.from_jsonl("code", "examples/data/code.jsonl")
source = z.MixtureWorkSource([prose, code], {"prose": 0.6, "code": 0.4},
                             chunk_size=8, seed=1234, stop_after_passes=20)
pipeline = (
    z.Pipeline(source)
    .tokenize("bytes", eos=True)
    .shuffle(32)
    .pack(512, algorithm="best_fit")
    .batch(4, labels=True)
    .options(canonical_replicas=4, flush_every_k_chunks=2, runner=sys.argv[1])
)

if __name__ == "__main__":
    with pipeline:
        for i, batch in enumerate(pipeline):
            print(batch.lane, batch.index_in_lane, batch["tokens"].shape)
            if i == 7:
                print("mark", time.time(), flush=True)  # the last batch: the rest is closing and exiting
                break
"""

WRONG_FIELD = """
import time
import zephon_dask as z

ds = z.Dataset.from_jsonl("prose", "examples/data/prose.jsonl", text_field="body")
p = z.Pipeline(z.MixtureWorkSource([ds], chunk_size=8)).tokenize("bytes").pack(256).batch(2)
try:
    for batch in p:
        pass
finally:
    print("mark", time.time(), flush=True)
"""

SCHEDULER_KILLED = """
import sys, time
import zephon_dask as z

ds = z.Dataset.from_jsonl("web", sys.argv[1], progress=False)
p = (z.Pipeline(z.MixtureWorkSource([ds], chunk_size=12, seed=1)).tokenize().pack(96).batch(3)
     .options(canonical_replicas=4, address=sys.argv[2], prefetch_windows=4, cluster_timeout=10,
              head_start=False))  # waits for the lost scheduler instead of computing here
stream = iter(p)
next(stream)
print("streaming", flush=True)
sys.stdin.readline()
try:
    for batch in stream:
        pass
finally:
    print("mark", time.time(), flush=True)
"""


def corpus(root: Path, files: int = 3, docs: int = 300) -> str:
    rng = random.Random(0)
    root.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        with open(root / f"part-{f}.jsonl", "w") as fh:
            for i in range(docs):
                fh.write(json.dumps({"text": f"{f}/{i} " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 120)))})
                         + "\n")
    return str(root)


def run_script(text: str, *args: str, stdin: str | None = None, before=None) -> tuple[float, float, str]:
    """Run ``text`` as a script from the repository root: ``(wall seconds, seconds from the line
    ``mark <epoch>`` it prints to its exit, output)``. ``before(proc)`` runs once it printed its
    first line, then ``stdin`` is written."""
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as fh:
        fh.write(text)
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, fh.name, *args], cwd=ROOT, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        if before is not None:
            lines.append(proc.stdout.readline())
            before(proc)
        if stdin is not None:
            proc.stdin.write(stdin)
            proc.stdin.flush()
        rest, _ = proc.communicate(timeout=600)
        exited, wall = time.time(), time.perf_counter() - t0
    finally:
        proc.kill()
        os.unlink(fh.name)
    out = "".join(lines) + rest
    mark = re.search(r"^mark (\d+\.\d+)", out, re.M)
    return wall, exited - float(mark.group(1)) if mark else float("nan"), out


def pipeline(data: str, **options):
    import zephon_dask as z

    ds = z.Dataset.from_jsonl("web", data, progress=False)
    return (z.Pipeline(z.MixtureWorkSource([ds], chunk_size=12, seed=1)).tokenize().pack(96).batch(3)
            .options(canonical_replicas=4, **options))


START = """
import json, sys, time
t0 = time.perf_counter()
try:
    import torch  # noqa: F401  (a training process has it)
except ImportError:
    pass
from distributed import Client
import zephon_dask.execution.spawned as spawned
from zephon_dask.execution.cluster import local_cluster
exec(open(sys.argv[1]).read().split("if __name__")[0].replace("sys.argv[1]", "'distributed'"))  # the quickstart pipeline
scheduler = []
start = spawned.SchedulerProcess.start
async def timed(self):
    await start(self)
    scheduler.append(time.perf_counter())
spawned.SchedulerProcess.start = timed
t = time.perf_counter()
with local_cluster(2) as cluster, Client(cluster, set_as_default=False) as client:
    client.wait_for_workers(2, timeout=300)
    ready = time.perf_counter() - t
    import psutil  # a fresh interpreter has a command line of its own; a forked process, its parent's
    interpreters = len({tuple(c.cmdline()) for c in psutil.Process().children(recursive=True)
                        if "resource_tracker" not in " ".join(c.cmdline())})
sched = scheduler[0] - t
t = time.perf_counter()
with pipeline:
    it = iter(pipeline)
    next(it)
    first = time.perf_counter() - t
    runner = pipeline.session.started_runner
    deadline = time.monotonic() + 300
    while runner.starting and time.monotonic() < deadline:
        time.sleep(0.01)
    up = time.perf_counter() - t
import zephon_dask
print(json.dumps({"ready": ready, "scheduler": sched, "first": first, "up": up, "interpreters": interpreters,
                  "package": zephon_dask.__file__}))
"""


def busy(n: int) -> list[subprocess.Popen]:
    """``n`` processes that each keep a core busy (the caller stops them)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def case_start(args, work) -> None:
    script = work / "start.py"
    script.write_text(START)
    quickstart = work / "quickstart_pipeline.py"
    quickstart.write_text(QUICKSTART)
    trees = {"this tree": None} if args.baseline is None else {"baseline": args.baseline, "this tree": None}
    rows: dict[tuple[str, str], list[dict]] = {(t, s): [] for t in trees for s in ("quiet", "under load")}
    for _ in range(args.repeat):
        for tree, state in rows:  # alternately, so all see the same machine
            hogs = busy(os.cpu_count() or 1) if state == "under load" else []
            env = dict(os.environ)
            if trees[tree] is not None:
                env["PYTHONPATH"] = os.pathsep.join([str(trees[tree]), env.get("PYTHONPATH", "")])
            try:
                out = subprocess.run([sys.executable, str(script), str(quickstart)], cwd=ROOT, capture_output=True,
                                     text=True, timeout=600, env=env)
            finally:
                for hog in hogs:
                    hog.kill()
                    hog.wait(timeout=30)
            assert out.returncode == 0, out.stderr[-2000:]
            row = json.loads(out.stdout.strip().splitlines()[-1])
            assert (trees[tree] is None) != row["package"].startswith(str(trees[tree])), row["package"]
            rows[tree, state].append(row)
    for (tree, state), runs in rows.items():
        print(f"  {tree:<9} {state:<10}  ready cluster {median(r['ready'] for r in runs):5.2f} s (its scheduler "
              f"{median(r['scheduler'] for r in runs):5.2f} s; {max(r['interpreters'] for r in runs)} fresh "
              f"interpreters); quickstart: first batch {median(r['first'] for r in runs):5.2f} s, its cluster "
              f"ready after {median(r['up'] for r in runs):5.2f} s")


def median(values) -> float:
    return statistics.median(values)


def case_quickstart(args, _work) -> None:
    runs: dict[str, list[tuple[float, float]]] = {"distributed": [], "threads": []}
    for _ in range(args.repeat):
        for runner in runs:  # interleaved, so both see the same load
            wall, exit_s, out = run_script(QUICKSTART, runner)
            assert "mark" in out, out[-2000:]
            runs[runner].append((wall, exit_s))
    walls = {r: median(w for w, _ in v) for r, v in runs.items()}
    exits = {r: median(e for _, e in v) for r, v in runs.items()}
    for r in runs:
        print(f"  quickstart, runner={r:<11}  wall {walls[r]:5.2f} s   exit after the last batch {exits[r]:5.2f} s")
    print(f"  default runner - threads: wall {walls['distributed'] - walls['threads']:+.2f} s "
          f"(x{walls['distributed'] / walls['threads']:.2f}), exit {exits['distributed'] - exits['threads']:+.2f} s")


def case_cli(args, _work) -> None:
    cli = str(Path(sys.executable).parent / "zephon-dask")
    walls: dict[str, list[float]] = {"distributed": [], "threads": []}
    for _ in range(args.repeat):
        for runner in walls:
            t0 = time.perf_counter()
            subprocess.run([cli, "run", "examples/recipe.toml", "--steps", "40", "--runner", runner], cwd=ROOT,
                           capture_output=True, check=True, timeout=600)
            walls[runner].append(time.perf_counter() - t0)
    for r, w in walls.items():
        print(f"  zephon-dask run --steps 40, runner={r:<11}  wall {median(w):5.2f} s")
    print(f"  default runner - threads: {median(walls['distributed']) - median(walls['threads']):+.2f} s")


def case_help(args, _work) -> None:
    """What ``zephon-dask --help`` adds to a bare interpreter's start: the best of 7 runs each."""
    def best_of_7(argv: list[str]) -> float:  # the best of 7 tolerates a busy machine
        times = []
        for _ in range(7):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, check=True, timeout=60)
            times.append(time.perf_counter() - t0)
        return min(times)

    bare, help_s = best_of_7(["-c", "pass"]), best_of_7(["-m", "zephon_dask.cli", "--help"])
    print(f"  zephon-dask --help  {help_s:5.3f} s, a bare interpreter {bare:5.3f} s: +{help_s - bare:5.3f} s")


def case_error(args, _work) -> None:
    exits, lines, failed = [], [], []
    for _ in range(args.repeat):
        _, exit_s, out = run_script(WRONG_FIELD)
        assert "MissingFieldError" in out, out[-2000:]
        exits.append(exit_s)
        lines.append(len(out.splitlines()) - 1)  # less the mark
        failed.append(out.count("Compute Failed"))
    print(f"  wrong text_field, uncaught, never closed: exit {median(exits):.2f} s after the error "
          f"(max {max(exits):.2f} s); {median(lines):.0f} lines printed, {max(failed)} 'Compute Failed' blocks")


def case_scheduler(args, work) -> None:
    data = corpus(work / "web")
    errors, exits, killed = [], [], []

    def kill(scheduler) -> None:
        scheduler.send_signal(signal.SIGKILL)
        killed.append(time.time())

    for _ in range(args.repeat):
        with dask_cluster(work, 1) as (address, scheduler, _):
            _, exit_s, out = run_script(SCHEDULER_KILLED, data, address, stdin="go\n",
                                        before=lambda _proc, s=scheduler: kill(s))
        mark = float(re.search(r"^mark (\d+\.\d+)", out, re.M).group(1))
        errors.append(mark - killed[-1])
        exits.append(exit_s)
    print(f"  scheduler killed (cluster_timeout 10 s), uncaught: error {median(errors):.1f} s after the kill, "
          f"exit {median(exits):.2f} s after the error (max {max(exits):.2f} s)")


def case_lost(args, work) -> None:
    from zephon_dask.errors import ClusterStallError

    data = corpus(work / "web")
    rows = []
    for _ in range(args.repeat):
        with dask_cluster(work, 2) as (address, _, workers):
            p = pipeline(data, address=address, prefetch_windows=6, cluster_timeout=10)
            with p:
                stream = iter(p)
                next(stream)
                inflight, watch = p.session.stream.fetcher.inflight, p.session.runner().watch
                deadline = time.monotonic() + 60
                while sum(h.done() for h in list(inflight.values())) < 3 and time.monotonic() < deadline:
                    time.sleep(0.05)
                held = sum(h.done() for h in list(inflight.values()))
                for w in workers:
                    w.send_signal(signal.SIGKILL)
                waits, checks = watch.waits, watch.checks
                t0, cpu0 = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF)
                try:
                    for _ in stream:
                        pass
                except ClusterStallError:
                    pass
                seconds, cpu1 = time.monotonic() - t0, resource.getrusage(resource.RUSAGE_SELF)
                cpu = (cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime) / seconds
                rows.append((seconds, cpu, (watch.waits - waits) / seconds, (watch.checks - checks) / seconds, held))
    print(f"  all workers killed, {median(r[4] for r in rows):.0f} finished results held (cluster_timeout 10 s): "
          f"error {median(r[0] for r in rows):.1f} s after the kill; training process {median(r[1] for r in rows):.1%} "
          f"of a core meanwhile, {median(r[2] for r in rows):.1f} waits/s, {median(r[3] for r in rows):.1f} RPCs/s")


def case_frozen(args, work) -> None:
    data = corpus(work / "web", files=4, docs=400)

    def digest(batch) -> str:
        return hashlib.sha256(b"".join(batch[k].tobytes() for k in sorted(batch.keys()))).hexdigest()

    with pipeline(data, runner="threads") as p:
        truth = [digest(b) for b in p]
    rows = []
    for _ in range(args.repeat):
        with dask_cluster(work, 2) as (address, _, workers):
            p = pipeline(data, address=address, prefetch_windows=8, stall_timeout=args.stall, cluster_timeout=120)
            with p:
                stream = iter(p)
                got = [digest(next(stream))]
                time.sleep(1)  # windows computed ahead on both workers
                workers[0].send_signal(signal.SIGSTOP)
                t0, times = time.monotonic(), []
                for b in stream:
                    got.append(digest(b))
                    times.append(time.monotonic() - t0)
        gaps = [b - a for a, b in zip([0.0, *times], times, strict=False)]
        rows.append((times[0], max(gaps), times[-1], got == truth))
    print(f"  one of 2 workers frozen (stall_timeout {args.stall:g} s): first batch {median(r[0] for r in rows):.1f} s "
          f"after the freeze, longest gap {median(r[1] for r in rows):.1f} s, stream done after "
          f"{median(r[2] for r in rows):.1f} s; batches equal to the uninterrupted run's: "
          f"{sum(r[3] for r in rows)} of {len(rows)} runs")


CASES = {"quickstart": case_quickstart, "cli": case_cli, "help": case_help, "error": case_error, "scheduler": case_scheduler,
         "lost": case_lost, "frozen": case_frozen, "start": case_start}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--stall", type=float, default=5.0, help="stall_timeout of the frozen case (seconds)")
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    ap.add_argument("--quick", action="store_true", help="one run of each case")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="start: a source tree of another version, run alternately with this one")
    args = ap.parse_args()
    if args.quick:
        args.repeat = 1
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        ap.error(f"unknown case(s) {unknown}; choose from {', '.join(CASES)}")
    print(f"bench_exit: {args.repeat} run(s) per case, medians; {os.cpu_count()} cores, "
          f"load {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in cases:
            print(f"{name}:", flush=True)
            CASES[name](args, Path(tmp))


if __name__ == "__main__":
    main()
