"""What the Dask dashboard's "bytes stored" holds during the demo, and why.

Runs the demo (``zephon_dask_demo``: dp=1 training, a checkpoint, the resume on dp=2 and the
uninterrupted reference, on one embedded cluster) in this process while a thread asks the
cluster's scheduler, every ``--every`` seconds, for the figures of the dashboard's memory bar:
"bytes stored" (the worker processes' resident memory), split into unmanaged memory (the
interpreters, the libraries and the tokenizer loaded in each worker) and managed memory (task
results held: finished windows the training process has not fetched yet), the latter by task group.
It also prints how many windows the head start computed in the training process (the dashboard
never sees those) and the size of the windows held.

    python benchmarks/bench_stored.py [--workdir .zephon-demo] [--steps 40] [--every 0.25] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import statistics
import sys
import threading
from collections import Counter


def memory(dask_scheduler) -> dict[str, object]:
    """The cluster's memory as the dashboard shows it, and the managed part by task group (runs on
    the scheduler). "Bytes stored" is ``process``: the worker processes' resident memory."""
    mem = dask_scheduler.memory
    groups: Counter = Counter()
    tasks: Counter = Counter()
    for ws in dask_scheduler.workers.values():
        for ts in ws.has_what:
            groups[ts.group_key] += ts.nbytes
            tasks[ts.group_key] += 1
    return {"process": mem.process, "managed": mem.managed, "unmanaged": mem.unmanaged,
            "workers": len(dask_scheduler.workers), "groups": dict(groups), "tasks": dict(tasks)}


def sample(samples: list[dict], stop: threading.Event, every: float) -> None:
    """Every ``every`` seconds, the memory of the cluster of the first client made in this process."""
    from distributed import Client

    client = None
    while not stop.wait(every):
        if client is None or client.status != "running":
            client = next((o for o in gc.get_objects() if isinstance(o, Client) and o.status == "running"), None)
        if client is not None:
            with contextlib.suppress(Exception):  # a client closing: the next one, next time
                samples.append(client.run_on_scheduler(memory))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", default=".zephon-demo")
    ap.add_argument("--steps", type=int, default=40, help="the demo's --steps")
    ap.add_argument("--every", type=float, default=0.25, help="seconds between samples")
    ap.add_argument("--quick", action="store_true", help="a shorter demo (--steps 16)")
    args = ap.parse_args(argv)
    if args.quick:
        args.steps = min(args.steps, 16)

    from zephon_dask_demo.job import run

    samples: list[dict] = []
    stop = threading.Event()
    sampler = threading.Thread(target=sample, args=(samples, stop, args.every), daemon=True)
    sampler.start()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = run(args.workdir, steps=args.steps)
    stop.set()
    sampler.join(timeout=30)
    here = next((line for line in out.getvalue().splitlines() if "computed in this process" in line), "")
    print(f"demo exit status {code}; {here.strip()}")
    if not samples:
        print("no sample: the cluster was never up while the demo ran")
        return 1
    mib = 2 ** 20
    print(f"{len(samples)} samples, {samples[0]['workers']} workers")

    def row(name: str, values: list[int]) -> str:
        return f"{name:<44} {max(values) / mib:>9.1f} {statistics.median(values) / mib:>11.1f}"

    print(f"{'':<44} {'peak MiB':>9} {'median MiB':>11}")
    print(row('"bytes stored" (worker processes\' memory)', [s["process"] for s in samples]))
    print(row("  unmanaged (interpreters, libraries)", [s["unmanaged"] for s in samples]))
    print(row("  managed (task results held)", [s["managed"] for s in samples]))
    for g in sorted({g for s in samples for g in s["groups"]}):
        held = [s["tasks"].get(g, 0) for s in samples]
        print(row(f"    {g}", [s["groups"].get(g, 0) for s in samples]) + f"  (up to {max(held)} held)")
    per = [s["groups"][g] / s["tasks"][g] for s in samples for g in s["groups"] if "window" in g]
    if per:
        print(f"one window's result: median {statistics.median(per) / mib:.2f} MiB")
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
