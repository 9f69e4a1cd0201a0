"""What a window costs in a Dask worker against a plain process, and what Dask adds around it.

The same windows (``bench_e2e.py``'s ``prose`` workload, each window twice per round,
results narrowed as the cluster holds them) are computed, alternately in rounds:

* ``pool``: by a ``ProcessPoolExecutor`` of ``--workers`` processes;
* ``dask``: as tasks on the embedded cluster (``local_cluster`` with the library's
  settings and its trim plugin, as the distributed runner starts it), as many in flight
  as the runner's default prefetch (one submitted as one ends), results fetched from the
  workers as they finish and released, as the runner's early fetch does;
* each ``--variant KEY=VALUE[,KEY=VALUE]``: the same with those Dask config keys
  changed on top of the embedded cluster's defaults (``None``: unset), e.g.
  ``distributed.worker.profile.enabled=False`` or
  ``distributed.nanny.pre-spawn-environ.MALLOC_ARENA_MAX=None``; the key
  ``trim-after-task`` sets the trim plugin's ``after_task_every`` (seconds) instead.

Inside every task the window's own CPU is read from the thread's ``getrusage``
(user, system, minor page faults); for the cluster also every worker thread's CPU
over the round, by role (the task thread, the event loop, other threads), so the
task thread's CPU beyond the window's is what Dask does in it, and the scheduler
process's; for both modes this (the parent) process's CPU: the pool's parent receiving
results, or the training process's client and nannies (the results fetched straight
from the workers, as the runner does). ``dask's own`` sums what Dask adds per window
over every process: the workers' threads less the windows' own CPU, the scheduler, and
the parent beyond the pool parent's. Medians of the rounds, ms per window. Nothing is
asserted; the results' bytes are the same by construction (the same ``compute_window``).
``--no-work``: each task returns its window computed beforehand by its process (each window
:data:`NO_WORK_REPEAT` times a round), so only what Dask adds around a task remains.

    python benchmarks/bench_task_cpu.py [--quick] [--rounds N] [--workers N] [--no-work] [--variant K=V[,K=V]] ...
"""

from __future__ import annotations

import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAYON_NUM_THREADS", "1")

import argparse  # noqa: E402
import concurrent.futures as cf  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402

from bench_e2e import WORKLOADS, _worker_threads, all_windows, build_pipeline, make_data  # noqa: E402

from zephon_dask.core.window import compute_window, narrowed  # noqa: E402

NO_WORK_REPEAT = 20  # --no-work: each window this many times a round (tasks of ~0 ms: more of them)
_WINDOWS: dict = {}  # --no-work: the windows a pool process computed, by (lane, window)


def _computed_windows(worker=None) -> dict:
    """--no-work: this process's windows computed so far (a Dask worker, ``worker`` or the task's,
    keeps them on itself: this module reaches the workers by value, so its globals would arrive
    empty each time)."""
    if worker is None:
        try:
            from distributed import get_worker

            worker = get_worker()
        except (ImportError, ValueError):
            return _WINDOWS
    return worker.__dict__.setdefault("bench_windows", {})


def timed_window(spec, lane: int, window: int, no_work: bool = False, worker=None):
    """The window (narrowed) and its thread's ``(user s, system s, minor faults)``; with
    ``no_work``, the same window computed once by this process and then returned as it is."""
    r0 = resource.getrusage(resource.RUSAGE_THREAD)
    if no_work:
        done = _computed_windows(worker)
        if (lane, window) not in done:
            done[lane, window] = narrowed(compute_window(spec, lane, window))
        out = done[lane, window]
    else:
        out = narrowed(compute_window(spec, lane, window))
    r1 = resource.getrusage(resource.RUSAGE_THREAD)
    return out, (r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime, r1.ru_minflt - r0.ru_minflt)


_SPEC = None
_NO_WORK = False


def _pool_init(spec, no_work_pairs: list | None) -> None:
    global _SPEC, _NO_WORK
    _SPEC, _NO_WORK = spec, no_work_pairs is not None
    if no_work_pairs is not None:  # --no-work: every window computed in every process
        _compute_all(spec, no_work_pairs)


def _pool_window(pair):
    return timed_window(_SPEC, *pair, no_work=_NO_WORK)[1]


def _process_cpu() -> float:
    """This process's CPU seconds so far, every thread (run on the scheduler too)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _compute_all(spec, pairs, dask_worker=None) -> None:
    """--no-work: compute every window of ``pairs`` in this process (a pool process, or run on
    each Dask worker)."""
    for lane, window in pairs:
        timed_window(spec, lane, window, no_work=True, worker=dask_worker)


def summary(inside: list, parent: float, threads: dict[str, float] | None = None,
            scheduler: float | None = None) -> dict[str, float]:
    """ms per window: the window's own CPU (user + system), its system part, minor faults, this
    process's CPU (``parent``, seconds over the round); with ``threads`` (seconds over the round),
    each worker-thread role's CPU per window, and the ``scheduler`` process's."""
    n = len(inside)
    out = {"window": sum(u + s for u, s, _ in inside) / n * 1e3, "of which system": sum(s for _, s, _ in inside) / n * 1e3,
           "minor faults": sum(f for _, _, f in inside) / n, "parent": parent / n * 1e3}
    for role, seconds in (threads or {}).items():
        out[f"worker {role}"] = seconds / n * 1e3
    if scheduler is not None:
        out["scheduler"] = scheduler / n * 1e3
    return out


def dask_own(row: dict[str, float], pool_parent: float) -> float:
    """What Dask adds per window (ms) over every process: the workers' threads beyond the
    windows' own CPU, the scheduler, and the parent beyond the pool parent's ``pool_parent``."""
    workers = sum(v for k, v in row.items() if k.startswith("worker "))
    return workers - row["window"] + row["scheduler"] + row["parent"] - pool_parent


def run_pool(spec, pairs, workers: int, no_work: bool = False) -> dict[str, float]:
    with cf.ProcessPoolExecutor(workers, initializer=_pool_init, initargs=(spec, pairs if no_work else None)) as pool:
        list(pool.map(_pool_window, pairs[:2 * workers]))  # every process started and warm
        parent = _process_cpu()
        inside = list(pool.map(_pool_window, pairs))
        return summary(inside, _process_cpu() - parent)


def run_dask(spec, pairs, workers: int, changes: dict, no_work: bool = False) -> dict[str, float]:
    changes = dict(changes)
    trim_after = changes.pop(TRIM_AFTER_TASK, None)
    import dask
    from distributed import Client, as_completed

    from zephon_dask.execution import cluster, plugins

    defaults = cluster.EMBEDDED_DEFAULTS
    cluster.EMBEDDED_DEFAULTS = {**defaults, **changes}
    try:
        local = cluster.local_cluster(workers)
        with dask.config.set(cluster.embedded_config()):  # the client's own keys too, as the runner's
            client = Client(local, set_as_default=False, direct_to_workers=True)
    finally:
        cluster.EMBEDDED_DEFAULTS = defaults
    try:
        plugin = plugins.TrimFreedMemory()
        if trim_after is not None:
            plugin.after_task_every = float(trim_after)
        client.register_plugin(plugin)
        spec_f = client.scatter(spec, broadcast=True)

        def submit(chosen):
            return client.map(timed_window, [spec_f] * len(chosen), [p[0] for p in chosen], [p[1] for p in chosen],
                              [no_work] * len(chosen), pure=False)

        if no_work:  # every window computed on every worker
            client.run(_compute_all, spec, pairs)
        client.gather(submit(pairs[:2 * workers]))  # every worker warm
        before = client.run(_worker_threads)
        scheduler, parent = client.run_on_scheduler(_process_cpu), _process_cpu()
        inside = []
        in_flight = 2 * workers + 4  # the runner's default prefetch: one submitted as one is taken
        running = as_completed(submit(pairs[:in_flight]), loop=client.loop)
        for future in running:
            inside.append(future.result()[1])
            future.release()
            nxt = len(inside) + in_flight - 1
            if nxt < len(pairs):
                running.add(submit(pairs[nxt:nxt + 1])[0])
        parent = _process_cpu() - parent
        scheduler = client.run_on_scheduler(_process_cpu) - scheduler
        after = client.run(_worker_threads)
        roles = {role for threads in after.values() for role in threads}
        threads = {role: sum(after[w].get(role, 0.0) - before[w].get(role, 0.0) for w in after) for role in sorted(roles)}
        return summary(inside, parent, threads, scheduler)
    finally:
        client.close()
        local.close()


TRIM_AFTER_TASK = "trim-after-task"  # a variant's key for the trim plugin's after_task_every (seconds)


def parse_variant(text: str) -> dict:
    out = {}
    for item in text.split(","):
        key, _, value = item.partition("=")
        out[key.strip()] = {"None": None, "True": True, "False": False}.get(value.strip(), value.strip())
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a fifth of the prose corpus (16 windows), 2 rounds")
    ap.add_argument("--rounds", type=int, default=None, help="alternating rounds (default 4; --quick 2)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="pool processes and Dask workers")
    ap.add_argument("--variant", action="append", default=[], help="Dask config changes on the embedded cluster")
    ap.add_argument("--no-work", action="store_true",
                    help="each task returns its window computed before (once per process): what remains is what Dask "
                         "(or the pool) adds around a task, without the windows' work beside it")
    args = ap.parse_args(argv)
    rounds = args.rounds or (2 if args.quick else 4)
    modes = {"pool": None, "dask": {}, **{v: parse_variant(v) for v in args.variant}}
    wl = WORKLOADS["prose"]
    with tempfile.TemporaryDirectory(prefix="zephon-bench-task-cpu-") as tmp:
        tok, summary_line = make_data(tmp, wl, args.quick, None)
        spec = build_pipeline(wl, tmp, tok, args.workers).spec
        pairs = all_windows(spec) * (NO_WORK_REPEAT if args.no_work else 2)
        print(f"{summary_line}; {len(pairs)} windows a round; {args.workers} workers on {os.cpu_count()} cores",
              flush=True)
        results: dict[str, list[dict]] = {}
        for r in range(rounds):
            for name, changes in modes.items():
                got = (run_pool(spec, pairs, args.workers, args.no_work) if changes is None
                       else run_dask(spec, pairs, args.workers, changes, args.no_work))
                if changes is not None:  # against this round's pool parent
                    got["dask's own"] = dask_own(got, results["pool"][-1]["parent"])
                results.setdefault(name, []).append(got)
                print(f"round {r + 1}/{rounds} {name}: " + ", ".join(f"{k} {v:.1f}" for k, v in got.items())
                      + f"; load average {os.getloadavg()[0]:.1f}", flush=True)
    print("\nms per window (medians of the rounds; minor faults: count per window):")
    columns = list(dict.fromkeys(k for rows in results.values() for row in rows for k in row))
    print(f"{'mode':40s} " + " ".join(f"{c:>18s}" for c in columns))
    for name, rows in results.items():
        cells = [statistics.median(row[c] for row in rows) if c in rows[0] else None for c in columns]
        print(f"{name[:40]:40s} " + " ".join(f"{c:18.1f}" if c is not None else f"{'':18s}" for c in cells))
    print("\ndask's own ms per window, by round (sorted):")
    for name, rows in results.items():
        if "dask's own" in rows[0]:
            print(f"{name[:40]:40s} " + ", ".join(f"{v:.1f}" for v in sorted(row["dask's own"] for row in rows)))


if __name__ == "__main__":
    main()
