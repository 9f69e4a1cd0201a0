"""The scheduler of an existing cluster lost and restarted at its address: how long training waits.

A ``dask scheduler`` and ``--workers`` ``dask worker`` processes on 127.0.0.1 (the tests'
helpers); a pipeline reaches them with ``address=`` and is consumed in this process, one
``--step`` seconds of "training" per batch, ``--prefetch`` windows in flight. After ``--after``
batches the scheduler and its workers are SIGKILLed, and ``--down`` seconds later a new
scheduler and new workers are started on the same port. Printed per run, for ``head_start`` on (windows computed in the training
process while no scheduler answers) and off (they wait for it): the longest gap between two
batches from the kill to the end of the stream against the median gap before it, when the new
scheduler's port opened, when the runner logged it was back on the cluster, the windows
computed here, and whether every batch equals an uninterrupted run's (the ``synchronous``
runner).

    python benchmarks/bench_reconnect.py [--repeat 3] [--workers 2] [--step 0.01] [--prefetch 2] [--down 2]
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repository: tests.helpers

from benchmarks.bench_exit import corpus  # noqa: E402
from tests.helpers.clusters import start_dask, stop_dask, unused_port  # noqa: E402


def pipeline(data: str, **options):
    import zephon_dask as z

    ds = z.Dataset.from_jsonl("web", data, progress=False)
    return (z.Pipeline(z.MixtureWorkSource([ds], chunk_size=12, seed=1)).tokenize().pack(96).batch(3)
            .options(canonical_replicas=4, **options))


def digest(batch) -> str:
    return hashlib.sha256(batch["tokens"].tobytes()).hexdigest()


class Marks(logging.Handler):
    """When the runner logged it lost the scheduler, and it was back."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.lost: float | None = None
        self.back: float | None = None

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if "lost the Dask scheduler" in text:
            self.lost = time.monotonic()
        elif "reconnected to the Dask scheduler" in text:
            self.back = time.monotonic()


def port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def one_run(args, work: Path, data: str, expected: list[str], head_start: bool) -> dict:
    port = unused_port()
    _, procs = start_dask(work, args.workers, port, limit=120)
    marks, restarted = Marks(), []
    logging.getLogger("zephon_dask").addHandler(marks)
    events: dict[str, float] = {}

    def outage() -> None:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()
        events["kill"] = time.monotonic()
        time.sleep(args.down)
        restarted.extend(start_dask(work, args.workers, port, limit=120)[1])
        events["ready"] = time.monotonic()

    def watch_port() -> None:  # when the new scheduler listens
        while "kill" not in events:
            time.sleep(0.01)
        while not port_open(port):
            time.sleep(0.02)
        events["port"] = time.monotonic()

    threads = [threading.Thread(target=outage), threading.Thread(target=watch_port, daemon=True)]
    got, times = [], []
    try:
        p = pipeline(data, address=f"tcp://127.0.0.1:{port}", prefetch_windows=args.prefetch, cluster_timeout=120,
                     head_start=head_start)
        with p:
            for batch in p:
                got.append(digest(batch))
                times.append(time.monotonic())
                if len(got) == args.after:
                    for t in threads:
                        t.start()
                time.sleep(args.step)
            here = len(p.session.runner().computed_here)
    finally:
        threads[0].join()
        stop_dask(procs + restarted)
        logging.getLogger("zephon_dask").removeHandler(marks)
    kill = events["kill"]
    before = [b - a for a, b in zip(times, times[1:], strict=False) if b < kill]
    after = [b - a for a, b in zip(times, times[1:], strict=False) if b >= kill]
    return {"longest": max(after), "median_before": statistics.median(before),
            "back": None if marks.back is None else marks.back - kill,
            "port": events.get("port", float("nan")) - kill, "here": here, "equal": got == expected,
            "batches": len(got)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--step", type=float, default=0.01, help="seconds of training per batch")
    ap.add_argument("--prefetch", type=int, default=2, help="prefetch_windows")
    ap.add_argument("--down", type=float, default=2.0, help="seconds between the kill and the restart")
    ap.add_argument("--after", type=int, default=20, help="batches before the kill")
    ap.add_argument("--docs", type=int, default=600, help="documents in each of 3 files")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data = corpus(work / "web", docs=args.docs)
        expected = [digest(b) for b in pipeline(data, runner="synchronous")]
        for head_start in (True, False):
            for i in range(args.repeat):
                r = one_run(args, work, data, expected, head_start)
                back = "none (the stream ended first)" if r["back"] is None else f"{r['back']:.1f} s after the kill"
                print(f"head_start={head_start} run {i + 1}: longest gap {r['longest']:.2f} s (median before the "
                      f"kill {r['median_before'] * 1000:.0f} ms); new scheduler's port open {r['port']:.1f} s after "
                      f"the kill; the runner's reconnect message {back}; {r['here']} window(s) computed here; "
                      f"{r['batches']} batches, equal to an uninterrupted run's: {r['equal']}", flush=True)


if __name__ == "__main__":
    main()
