"""Train on a shared Dask cluster under torchrun; stop cleanly on SIGTERM and resume from --ckpt.

    torchrun --nnodes=2 --nproc-per-node=2 ... examples/clusters/train.py \
        --scheduler-file /shared/scheduler.json --ckpt /shared/ckpt --steps 40

Started by examples/slurm/train.sbatch and examples/kubernetes/train-job.yaml (see
docs/clusters.md). Every rank connects to the one Dask cluster (by its scheduler file or
address) and takes its share of each global step. A checkpoint is a folder ``step-N``
under ``--ckpt`` holding the model, the optimizer and the data state after global step N;
``latest`` names the newest complete one and is written last, so a job killed while
saving resumes from the one before. On SIGTERM (or SIGINT) every rank stops at the end
of the step, the step is checkpointed, and the process exits 143 (130); a run that
finished its steps writes ``done`` and exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

import zephon_dask as z

RECIPE = Path(__file__).resolve().parents[1] / "recipe.toml"  # examples/recipe.toml: 4 lanes, 53 steps
KEEP = 2  # checkpoints kept: the newest and the one before


def scheduler_address(scheduler_file: str, timeout: float = 300.0) -> str:
    """The address in a ``dask scheduler --scheduler-file`` file, waiting for the scheduler to write it."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return json.loads(Path(scheduler_file).read_text())["address"]
        except (OSError, ValueError, KeyError):  # not there yet, or half written
            if time.monotonic() > deadline:
                raise TimeoutError(f"no scheduler wrote {scheduler_file} within {timeout:g} s") from None
            time.sleep(0.5)


def save(ckpt: Path, step: int, model, optimizer, state: dict) -> None:
    """``ckpt/step-<step>/`` with the model, optimizer and data state, then ``ckpt/latest`` (rank 0)."""
    folder = ckpt / f"step-{step}"
    folder.mkdir(parents=True, exist_ok=True)
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, folder / "model.pt")
    z.save_state(folder / "data.json", state)  # atomic, with a checksum
    tmp = ckpt / "latest.tmp"
    tmp.write_text(folder.name)
    os.replace(tmp, ckpt / "latest")  # the pointer last: a half-written folder is never resumed
    for old in sorted(ckpt.glob("step-*"), key=lambda p: int(p.name[5:]))[:-KEEP]:
        shutil.rmtree(old, ignore_errors=True)


def train(a: argparse.Namespace, stop: z.Preemption, stack: contextlib.ExitStack) -> bool:
    """Train up to ``a.steps`` global steps or until a rank is signalled; whether every step is done."""
    distributed = "WORLD_SIZE" in os.environ  # under torchrun
    if distributed and torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    if distributed:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        stack.callback(dist.destroy_process_group)
    rank = dist.get_rank() if distributed else 0

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(258, 64), torch.nn.Linear(64, 258)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ddp = torch.nn.parallel.DistributedDataParallel(model) if distributed else model

    pipe = z.Pipeline.from_config(a.recipe)  # DP identity: torch.distributed's world size and rank
    if a.threads:
        pipe = pipe.options(runner="threads")
    else:
        pipe = pipe.options(address=a.address or scheduler_address(a.scheduler_file))
    stack.enter_context(pipe)  # closed on the way out: the cluster keeps running
    ckpt, start = Path(a.ckpt), 0
    if (ckpt / "latest").exists():  # a requeued or restarted job: resume, on any number of ranks
        folder = ckpt / (ckpt / "latest").read_text().strip()
        saved = torch.load(folder / "model.pt", map_location=device)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        state = z.load_state(folder / "data.json")
        pipe.load_state_dict(state)
        start = state["step"]["global_step"]
    if rank == 0:
        print(f"training from global step {start} to {a.steps}", flush=True)

    per_rank = pipe.session.step_shape().per_rank
    batches = iter(pipe.to_torch(device=device))
    for step in range(start, a.steps):
        for _ in range(per_rank):
            batch = next(batches)
            logits = ddp(batch["input_ids"])
            loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100)
            (loss / per_rank).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        stopping = stop.should_stop()  # a collective: every rank, every step
        if stopping or step + 1 == a.steps or (step + 1) % a.save_every == 0:
            # a collective too: the merged state of every rank
            state = z.gather_state(pipe) if distributed else pipe.state_dict()
            if rank == 0:
                with stop.deferred():  # a second signal waits until the checkpoint is written
                    save(ckpt, step + 1, model, optimizer, state)
                print(f"global step {step + 1}: loss {loss.item():.3f}, checkpoint saved", flush=True)
        if stopping:
            return False
    if rank == 0:
        (ckpt / "done").write_text(f"{a.steps}\n")
    return True


def parser() -> argparse.ArgumentParser:
    """The command line: where the cluster is, the checkpoint folder, the recipe and the steps."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--scheduler-file", help="written by `dask scheduler --scheduler-file`")
    where.add_argument("--address", help="tcp://host:8786 of a running scheduler")
    where.add_argument("--threads", action="store_true", help="no cluster: a thread pool in each process")
    ap.add_argument("--ckpt", required=True, help="a folder every rank's node can read (rank 0 writes)")
    ap.add_argument("--recipe", default=str(RECIPE), help="its canonical_replicas: the most ranks it can take")
    ap.add_argument("--steps", type=int, default=40, help="global steps to train in all")
    ap.add_argument("--save-every", type=int, default=100, help="also checkpoint every N global steps")
    return ap


def main(argv=None) -> int:
    a = parser().parse_args(argv)

    with contextlib.ExitStack() as stack:
        stop = stack.enter_context(z.Preemption())  # from here SIGTERM/SIGINT stop at the end of a step
        done = train(a, stop, stack)
    # 0 when every step is trained; otherwise the status of a stop by SIGTERM (or SIGINT) on every
    # rank, the one signalled and the ones that stopped with it, so that the job is run again
    return 0 if done else stop.exit_code or 143


if __name__ == "__main__":
    sys.exit(main())
