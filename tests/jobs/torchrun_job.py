"""A training-loop stand-in run by ``torchrun`` in tests/integrations/test_torchrun.py (gloo backend).

Each rank streams ``--steps`` optimizer steps of ``batches_per_step`` batches
(each ``--step-s`` seconds longer: a model's step), optionally resuming from
``--resume`` first, then checkpoints collectively to ``--save``. Under
``zephon_dask.Preemption``, SIGINT or SIGTERM (tests/integrations/test_interrupts.py) stops
every rank at the end of the same step; the checkpoint is then written, each
rank prints the step and exits with 128 + the signal. With ``--tp T`` consecutive ranks form tensor-parallel peers
of one DP group, and each rank writes its batch digests to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: tests.helpers

import zephon_dask as z  # noqa: E402
from tests.helpers.pipelines import build  # noqa: E402
from zephon_dask.state import batch_digest  # noqa: E402

REPLICAS = 8


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--ledger")
    ap.add_argument("--resume")
    ap.add_argument("--save")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--out")
    ap.add_argument("--step-s", type=float, default=0.0)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dp, group = world // args.tp, rank // args.tp
    options = {"runner": "threads", "batches_per_step": REPLICAS // dp, "ledger": args.ledger}
    if args.tp > 1:
        options.update(dp_degree=dp, dp_group_id=group)
    pipe = build(Path(args.corpus), R=REPLICAS, k=1, microbatch=2, **options)
    if args.resume:
        pipe.load_state_dict(z.load_state(args.resume))
    digests, stopped = [], False
    with z.Preemption() as stop:
        batches = iter(pipe)
        for _ in range(args.steps):
            for _ in range(REPLICAS // dp):
                batch = next(batches)
                digests.append([batch.lane, batch.index_in_lane, batch_digest(batch["tokens"])])
            time.sleep(args.step_s)
            dist.barrier()  # the optimizer step
            stopped = stop.should_stop()  # a collective: every rank, every step
            if stopped:
                break
        if args.save:
            state = z.gather_state(pipe)
            if rank == 0:
                z.save_state(args.save, state)
            if stopped:
                print(f"rank {rank}: stopped at global step {state['step']['global_step']}", flush=True)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / f"rank-{rank}.json").write_text(json.dumps({"group": group, "batches": digests}))
    pipe.close()
    dist.barrier()
    dist.destroy_process_group()
    return stop.exit_code

if __name__ == "__main__":
    raise SystemExit(main())
