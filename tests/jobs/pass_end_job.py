"""Passes over a finite packed stream under ``torchrun`` (gloo), run by tests/integrations/test_torchrun.py.

Each rank iterates ``--passes`` passes (a framework's epochs) of the
pipeline, writing the ledger; with ``--save-at N`` every rank stops after
global step N and rank 0 saves the gathered state there; ``--resume`` loads
one first. The groups' lanes end on different steps: the pass must still
end on the same global step on every rank, the one a single process ends on.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: tests.helpers

import zephon_dask as z  # noqa: E402
from tests.helpers.pipelines import build  # noqa: E402

SEED, REPLICAS = 4, 4  # lanes of 31, 34, 26 and 31 batches (see the test)


def pipeline(corpus: Path, ledger: str | None):
    return build(corpus, seed=SEED, R=REPLICAS, k=1, microbatch=2, runner="synchronous", ledger=ledger)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--ledger", required=True)
    ap.add_argument("--passes", type=int, required=True)
    ap.add_argument("--save-at", type=int)
    ap.add_argument("--save")
    ap.add_argument("--resume")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    pipe = pipeline(Path(args.corpus), args.ledger)
    step = 0
    if args.resume:
        state = z.load_state(args.resume)
        pipe.load_state_dict(state)
        step = state["step"]["global_step"]
    per_rank = pipe.session.step_shape().per_rank
    with pipe:
        for _ in range(args.passes):
            served = 0
            for served, _batch in enumerate(pipe, 1):
                if served % per_rank == 0 and step + served // per_rank == args.save_at:
                    state = z.gather_state(pipe)
                    if dist.get_rank() == 0:
                        z.save_state(args.save, state)
                    dist.barrier()
                    dist.destroy_process_group()
                    return 0
            assert served % per_rank == 0, f"rank {dist.get_rank()}: a pass of {served} batches"
            step += served // per_rank
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
