"""A training-loop stand-in run by ``torchrun`` in tests/test_torchrun.py (gloo backend).

Each rank streams ``--steps`` optimizer steps of ``batches_per_step`` batches,
optionally resuming from ``--resume`` first, then checkpoints collectively
to ``--save``. With ``--tp T`` consecutive ranks form tensor-parallel peers
of one DP group, and each rank writes its batch digests to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))

from pipelines import build  # noqa: E402

import zephon_dask as z  # noqa: E402
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
    digests = []
    batches = iter(pipe)
    for _ in range(args.steps):
        for _ in range(REPLICAS // dp):
            batch = next(batches)
            digests.append([batch.lane, batch.index_in_lane, batch_digest(batch["tokens"])])
        dist.barrier()  # the optimizer step
    if args.save:
        state = z.gather_state(pipe)
        if rank == 0:
            z.save_state(args.save, state)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / f"rank-{rank}.json").write_text(json.dumps({"group": group, "batches": digests}))
    pipe.close()
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
