"""Dask workers as SLURM jobs of their own (dask-jobqueue), shared by the training jobs.

    python examples/slurm/dask_workers.py --scheduler-file /shared/zephon/scheduler.json --jobs 4
    python examples/slurm/dask_workers.py --scheduler-file scheduler.json --print-job-script

For GPU nodes without cores to spare: the scheduler runs in this process, each worker job takes
a node of the CPU partition, and the training job's ranks connect through the scheduler file
(``examples/clusters/train.py --scheduler-file``). Run it where it can stay up as long as the
training (a login node's terminal multiplexer, or a long job of its own); Ctrl-C or SIGTERM
cancels the worker jobs. ``pip install 'zephon_dask[slurm]'`` installs dask-jobqueue.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from dask_jobqueue import SLURMCluster


def make_cluster(scheduler_file: str, *, host: str | None = None, dashboard_address: str = ":8787",
                 queue: str = "cpu", cores: int = 32, memory: str = "128GB",
                 walltime: str = "24:00:00") -> SLURMCluster:
    """A cluster whose worker jobs each run ``cores`` one-thread workers; its scheduler (here,
    listening on ``host``, by default this machine's address) writes ``scheduler_file``."""
    scheduler_options = {"scheduler_file": scheduler_file, "dashboard_address": dashboard_address}
    if host is not None:
        scheduler_options["host"] = host
    return SLURMCluster(
        queue=queue, cores=cores, processes=cores, memory=memory, walltime=walltime,  # 1 thread each
        job_name="zephon-dask",
        job_script_prologue=["export RAYON_NUM_THREADS=1",  # one tokenizer thread per Dask thread
                             "export TOKENIZERS_PARALLELISM=false"],
        scheduler_options=scheduler_options,
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scheduler-file", required=True, help="on a filesystem the training nodes mount")
    ap.add_argument("--jobs", type=int, default=4, help="worker jobs to submit")
    ap.add_argument("--print-job-script", action="store_true", help="print a worker job's script, submit nothing")
    a = ap.parse_args(argv)
    stop = threading.Event()
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, lambda *_: stop.set())
    with make_cluster(a.scheduler_file) as cluster:
        if a.print_job_script:
            print(cluster.job_script())
            return 0
        cluster.scale(jobs=a.jobs)
        print(f"scheduler at {cluster.scheduler_address}, dashboard {cluster.dashboard_link}", flush=True)
        stop.wait()  # until Ctrl-C or SIGTERM; leaving the block cancels the worker jobs
    return 0


if __name__ == "__main__":
    sys.exit(main())
