"""A training loop that checkpoints when preempted, run by ``torchrun`` in tests/test_interrupts.py.

Each rank streams up to ``--steps`` optimizer steps of its share of 8 batches
(gloo, the threads runner); ``zephon_dask.Preemption`` turns SIGINT or SIGTERM
into a stop at the end of the step, agreed over the ranks; then the merged
state is saved to ``--save`` and the rank exits with 128 + the signal. Each
step sleeps ``--step-s`` seconds, the time a model's step would take.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))

from pipelines import build  # noqa: E402

import zephon_dask as z  # noqa: E402

REPLICAS = 8


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--ledger", required=True)
    ap.add_argument("--save", required=True)
    ap.add_argument("--step-s", type=float, default=0.0)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, dp = dist.get_rank(), dist.get_world_size()
    pipe = build(Path(args.corpus), R=REPLICAS, k=1, microbatch=2, runner="threads",
                 batches_per_step=REPLICAS // dp, ledger=args.ledger)
    with z.Preemption() as stop, pipe:
        batches = iter(pipe)
        for _ in range(args.steps):
            for _ in range(REPLICAS // dp):
                next(batches)
            time.sleep(args.step_s)
            dist.barrier()  # the optimizer step
            if stop.should_stop():
                break
        state = z.gather_state(pipe)
        if rank == 0:
            z.save_state(args.save, state)
        print(f"rank {rank}: stopped at global step {state['step']['global_step']}", flush=True)
    dist.destroy_process_group()
    return stop.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
