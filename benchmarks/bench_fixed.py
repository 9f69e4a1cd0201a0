"""What the embedded cluster costs a short run: its processes, their imports, their CPU before
the first worker task, and the training process's time from ``iter()`` to the end of ``close()``.

Workload: ``bench_ceiling.py``'s pipeline (prose 0.7 / code 0.3, ``tokenize``, ``pack(2048)``
wrap, ``shuffle(1024)``, ``batch(8)``, ``canonical_replicas=8``, chunk 64) on ``bench_e2e.py``'s
``mixed`` corpus at a tenth of its size (``--scale``), one pass with the default options (the
embedded cluster, its head start), in a fresh training process that imported torch first.

Per round and per tree it prints:

* **processes**: every process the run started (the cluster's host, its scheduler, each
  worker), when each started (seconds from ``iter()``), how many modules each had imported
  once the pass was over (and which heavy libraries: torch, pandas, pyarrow, bokeh, ...), and its CPU
  seconds when the cluster took the windows (before any worker task ran) and at the end of the pass;
* **the training process**: CPU of the cluster's start on its own thread (importing
  ``distributed``, the nannies, the client) and the marks from ``iter()``: the first batch, the
  cluster's start beginning, the cluster ready (taking the windows), the last batch, and
  ``close()`` (its wall and CPU);
* **fixed cost**: the CPU the cluster's start spends before the first worker task, every
  process together (the host, the scheduler, the workers, the training process's start thread);
* **the first batch against its floor**: one single-threaded tokenizer process per core on the
  documents the first batch depends on (``bench_ceiling.py``'s floor), in the same round.

Rounds alternate this tree with ``--baseline DIR`` (another version's source tree, e.g.
``git archive main | tar -x -C DIR``); each round's figures come from passes side by side.
Every pass's batches are hashed (sha256) and must be the same in every pass; the load average
is printed; nothing is asserted.

    python benchmarks/bench_fixed.py [--rounds N] [--scale F] [--baseline DIR]
"""

from __future__ import annotations

import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAYON_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import pickle  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

CHILD = "--_fixed-child"
BEGIN, THREAD, PROCS = "the cluster's start may begin", "the start's thread", "the cluster's processes and nannies"
HEAVY = ("torch", "pandas", "pyarrow", "pyarrow.dataset", "bokeh", "transformers", "zarr", "datasets", "scipy",
         "tokenizers", "numpy", "fsspec", "jinja2", "tornado", "psutil")


def _proc_stat(pid: int) -> tuple[float, float] | None:
    """``(CPU seconds, start in seconds since boot)`` of ``pid`` from ``/proc``; ``None`` once gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick, int(fields[19]) / tick


def _uptime() -> float:
    with open("/proc/uptime") as f:
        return float(f.read().split()[0])


def _descendants() -> list[int]:
    import psutil

    return [p.pid for p in psutil.Process().children(recursive=True)]


def _modules() -> dict:
    """This process's imported modules: how many, and which heavy libraries."""
    return {"n": len(sys.modules), "heavy": [m for m in HEAVY if m in sys.modules]}


def _thread_cpu() -> dict[str, float]:
    """CPU seconds of this process's threads by role: the main thread, the cluster's start, Dask's event
    loop (the client's and the nannies'), the head start's windows (its driver and pool), the rest."""
    import threading

    import psutil

    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    for t in psutil.Process().threads():
        name = names.get(t.id, "")
        role = ("main" if t.id == threading.main_thread().native_id else "the cluster's start"
                if name.startswith("zephon-cluster-start") else "Dask's event loop"
                if "IO loop" in name or "IOLoop" in name else "head start" if name.startswith("zephon-")
                else "other")
        out[role] = out.get(role, 0.0) + t.user_time + t.system_time
    return out


def child(data: str, tok: str) -> None:
    """One cold pass with the default options in this fresh training process, then ``close()``; one
    JSON line (see the module docstring)."""
    import threading

    import torch  # noqa: F401  (a training process has torch loaded)

    from zephon_dask.execution import head_start, runner

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_ceiling import build
    from bench_e2e import Tally

    marks: dict[str, float] = {}
    snaps: dict[str, dict[int, float]] = {}
    start_cpu: dict[str, float] = {}
    by_thread: dict[str, dict[str, float]] = {}
    t0 = 0.0

    def snapshot(label: str) -> None:
        snaps[label] = {pid: s[0] for pid in [os.getpid(), *_descendants()] if (s := _proc_stat(pid))}
        by_thread[label] = _thread_cpu()

    def mark(owner, name: str, label: str, snap: bool = False, thread_cpu: bool = False) -> None:
        fn = getattr(owner, name)

        def wrapper(*args, **kwargs):
            if label not in marks:
                marks[label] = time.perf_counter() - t0
                if snap:
                    snapshot(label)
            cpu = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                if thread_cpu:
                    start_cpu[label] = start_cpu.get(label, 0.0) + time.thread_time() - cpu
                    marks.setdefault(f"{label}: end", time.perf_counter() - t0)

        setattr(owner, name, wrapper)

    mark(head_start.Boot, "begin", "the cluster's start may begin")
    mark(head_start.HeadStart, "hand_over", "the cluster takes the windows", snap=True)
    mark(runner.DistributedRunner, "_start_embedded", "the start's thread", thread_cpu=True)
    mark(runner, "use_distributed", "import distributed", thread_cpu=True)
    mark(runner, "local_cluster", "the cluster's processes and nannies", thread_cpu=True)

    pipe = build(data, tok)
    tally = Tally()
    uptime0, t0 = _uptime(), time.perf_counter()
    first = None
    for batch in pipe:
        if first is None:
            first = time.perf_counter() - t0
        tally.add(batch)
    last = time.perf_counter() - t0
    snapshot("the last batch")
    warm_tally = Tally()
    t = time.perf_counter()
    for batch in pipe:  # the same pass again, on the cluster now up: what the pass costs without the start
        warm_tally.add(batch)
    warm = time.perf_counter() - t
    run = pipe.session.runner()
    roles = {os.getpid(): "training process"}
    roles[run.client.run_on_scheduler(os.getpid)] = "scheduler"
    for i, (_, pid) in enumerate(sorted(run.worker_pids().items())):
        roles[pid] = f"worker {i}"
    modules = {"training process": _modules(), "scheduler": run.client.run_on_scheduler(_modules)}
    for addr, got in run.client.run(_modules).items():
        modules[roles[run.worker_pids()[addr]]] = got
    started = {}
    for pid in _descendants():
        s = _proc_stat(pid)
        if s is None:
            continue
        if pid not in roles:
            import psutil

            cmd = " ".join(psutil.Process(pid).cmdline())
            roles[pid] = ("host" if "zephon_dask.execution.host" in cmd else "resource tracker"
                          if "resource_tracker" in cmd else "other")
        started[roles[pid]] = s[1] - uptime0
    pids = list(roles)
    c0 = time.process_time()
    t = time.perf_counter()
    pipe.close()
    close_s, close_cpu = time.perf_counter() - t, time.process_time() - c0
    alive = [roles[p] for p in pids if p != os.getpid() and _proc_stat(p) is not None]
    threads = threading.active_count()
    out = {"first": first, "last": last, "warm": warm, "warm_same": warm_tally.digest() == tally.digest(), "close": close_s, "close_cpu": close_cpu, "marks": marks,
           "start_cpu": start_cpu, "threads": by_thread, "started": started, "modules": modules, "sha": tally.digest(),
           "batches": tally.batches, "alive_after_close": alive, "threads_after_close": threads,
           "cpu": {label: {roles.get(pid, "other"): cpu for pid, cpu in snap.items()} for label, snap in snaps.items()},
           "package": sys.modules["zephon_dask"].__file__}
    print(json.dumps(out), flush=True)


def run_child(data: str, tok: str, tree: str | None) -> dict:
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join([os.path.abspath(tree), env.get("PYTHONPATH", "")])
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), CHILD, data, tok], stdout=subprocess.PIPE,
                            text=True, env=env, cwd=os.path.abspath(tree) if tree is not None else None)
    line = proc.stdout.readline()
    while line and not line.startswith("{"):  # the report: printed after close(), before the exit
        line = proc.stdout.readline()
    printed = time.perf_counter()
    code = proc.wait(timeout=900)
    got_exit = time.perf_counter()
    proc.stdout.read()  # (the cluster's processes hold it until they end)
    if code or not line.startswith("{"):
        raise SystemExit(f"the training process failed (exit {code})")
    got = json.loads(line)
    got["process_wall"], got["exit"] = got_exit - t, got_exit - printed
    if tree is not None and not got["package"].startswith(os.path.abspath(tree)):
        raise SystemExit(f"the baseline's pass imported {got['package']}, not the tree {tree}")
    return got


def fixed_cpu(got: dict) -> dict[str, float]:
    """CPU seconds before the first worker task, by process (the training process: its start thread)."""
    snap = got["cpu"].get("the cluster takes the windows", {})
    out = {role: cpu for role, cpu in snap.items() if role != "training process"}
    threads = got["threads"].get("the cluster takes the windows", {})
    for role in ("the cluster's start", "Dask's event loop", "other"):
        out[f"training process: {role}"] = threads.get(role, 0.0)
    return out


def show(label: str, got: dict, floor: float) -> None:
    m = got["marks"]
    fixed = fixed_cpu(got)
    print(f"  {label}: first batch {got['first']:.2f} s ({got['first'] / floor:.2f}x the floor {floor:.2f} s), "
          f"start may begin {m.get(BEGIN, float('nan')):.2f} s, cluster takes the windows "
          f"{m.get('the cluster takes the windows', float('nan')):.2f} s, last batch {got['last']:.2f} s, close "
          f"{got['close']:.2f} s ({got['close_cpu']:.2f} s CPU), the same pass warm {got['warm']:.2f} s, process {got['process_wall']:.2f} s; "
          f"CPU before the first worker task {sum(fixed.values()):.2f} s", flush=True)
    for role in sorted(set(got["started"]) | set(got["modules"])):
        mods = got["modules"].get(role, {})
        print(f"      {role:20s} started {got['started'].get(role, float('nan')):5.2f} s  "
              f"CPU before the first task {fixed.get(role, float('nan')):.2f} s, at the last batch "
              f"{got['cpu']['the last batch'].get(role, float('nan')):.2f} s  modules {mods.get('n', '-')} "
              f"{','.join(mods.get('heavy', []))}")
    print(f"      training process: start thread {got['start_cpu'].get(THREAD, 0):.2f} s CPU "
          f"(import distributed {got['start_cpu'].get('import distributed', 0):.2f} s, processes and nannies "
          f"{got['start_cpu'].get(PROCS, 0):.2f} s); modules "
          f"{got['modules']['training process']['n']}; after close: {got['alive_after_close'] or 'no process'} alive")


def main(argv=None) -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_ceiling import Limits, build, plan_texts, tokenizer_path
    from bench_e2e import WORKLOADS, make_data

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    ap.add_argument("--scale", type=float, default=0.5, help="of bench_ceiling.py --quick's corpus (default 0.5)")
    ap.add_argument("--data", help="a corpus folder (DIR/prose, DIR/code, a tokenizer.json); default: generated")
    ap.add_argument("--baseline", help="a source tree of another version, run before this tree in every round")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="zephon-bench-fixed-") as tmp:
        if args.data:
            data, tok = args.data, tokenizer_path(args.data)
        else:
            data = tmp
            wl = WORKLOADS["mixed"]
            wl = type(wl)(**{**vars(wl), "prose_mb": wl.prose_mb * args.scale, "code_mb": wl.code_mb * args.scale})
            tok, summary = make_data(tmp, wl, True, None)
            print(summary)
        pipe = build(data, tok, workers=1)
        texts = plan_texts(pipe)
        texts_path = os.path.join(tmp, "texts.pickle")
        with open(texts_path, "wb") as f:
            pickle.dump({"floor": texts["floor"], "all": texts["floor"]}, f, protocol=5)
        limits = Limits(tok, texts_path, os.cpu_count() or 1)
        rows: dict[str, list] = {"baseline": [], "this tree": []}
        try:
            for r in range(args.rounds):
                floor = limits.run("floor")["s"]
                print(f"round {r + 1}/{args.rounds} (load average {os.getloadavg()[0]:.1f}):", flush=True)
                for label, tree in (("baseline", args.baseline), ("this tree", None)):
                    if label == "baseline" and tree is None:
                        continue
                    got = run_child(data, tok, tree)
                    got["floor"] = floor
                    rows[label].append(got)
                    show(label, got, floor)
        finally:
            limits.close()
    summary_rows(rows)


def summary_rows(rows: dict[str, list]) -> None:
    def rng(values) -> str:
        return f"{min(values):.2f}-{max(values):.2f} (median {statistics.median(values):.2f})"

    shas = {g["sha"] if g["warm_same"] else "differs" for runs in rows.values() for g in runs}
    print("\nmedians and ranges over the rounds:")
    for label, runs in rows.items():
        if not runs:
            continue
        fixed = [fixed_cpu(g) for g in runs]
        print(f"  {label}:")
        print(f"    CPU before the first worker task, every process: {rng([sum(f.values()) for f in fixed])} s")
        for role in sorted({k for f in fixed for k in f}):
            print(f"      {role:38s} {rng([f.get(role, 0.0) for f in fixed])} s")
        print(f"    processes started: {rng([len(g['started']) for g in runs])}")
        print(f"    first batch against its floor: {rng([g['first'] / g['floor'] for g in runs])}x")
        print(f"    cluster takes the windows at: {rng([g['marks'].get('the cluster takes the windows', 0) for g in runs])} s")
        print(f"    the cold pass less the same pass warm (what the start costs the pass): "
              f"{rng([g['last'] - g['warm'] for g in runs])} s")
        print(f"    last batch: {rng([g['last'] for g in runs])} s; close(): {rng([g['close'] for g in runs])} s, "
              f"process end to end: {rng([g['process_wall'] for g in runs])} s, of which the interpreter's "
              f"exit after close(): {rng([g['exit'] for g in runs])} s")
    print(f"batches the same in every pass (sha256): {'YES' if len(shas) == 1 else 'NO'} "
          f"[{next(iter(shas))[:16] if shas else '-'}]; load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == CHILD:
        child(*sys.argv[2:4])
    else:
        main()
