"""Real multi-process runs under ``torchrun --standalone`` with the gloo backend."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.helpers.pipelines import build
from zephon_dask.cli import main as cli

JOB = Path(__file__).resolve().parents[1] / "jobs" / "torchrun_job.py"


def torchrun(nproc: int, *args: str, timeout: float = 240, job: str = JOB.name) -> None:
    """Run ``job`` (a script in tests/jobs/) on ``nproc`` local ranks; the whole process group is killed if it hangs."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           str(JOB.parent / job), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": str(nproc)}
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, out[-4000:]


def test_two_ranks_checkpoint_then_four_ranks_resume(corpus_dir, tmp_path):
    truth = build(corpus_dir, R=8, k=1, microbatch=2, runner="synchronous", batches_per_step=8,
                  ledger=str(tmp_path / "truth"))
    with truth:
        for _ in zip(range(30 * 8), truth, strict=False):
            pass
    ckpt = tmp_path / "ckpt.json"
    common = ["--corpus", str(corpus_dir), "--ledger", str(tmp_path / "run")]
    torchrun(2, *common, "--steps", "10", "--save", str(ckpt))
    state = json.loads(ckpt.read_text())["state"]
    assert sorted(state["lanes"], key=int) == [str(lane) for lane in range(8)]
    want = {"global_step": 10, "batches_in_step": 0, "batches_per_step": 4, "dp_degree": 2, "global_batches": 8,
            "microbatch_size": 2}
    assert {k: state["step"][k] for k in want} == want  # a later version may record more
    torchrun(4, *common, "--steps", "20", "--resume", str(ckpt))
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [f"rank-{r}.jsonl" for r in range(4)]
    assert cli(["verify", str(tmp_path / "truth"), str(tmp_path / "run")]) == 0
    steps = {json.loads(line)["global_step"] for r in range(4)
             for line in (tmp_path / "run" / f"rank-{r}.jsonl").read_text().splitlines()}
    assert steps == set(range(30))


def test_tensor_parallel_peers_receive_identical_batches(corpus_dir, tmp_path):
    torchrun(4, "--corpus", str(corpus_dir), "--steps", "6", "--tp", "2", "--out", str(tmp_path))
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(4)]
    assert [r["group"] for r in ranks] == [0, 0, 1, 1]
    assert ranks[0]["batches"] == ranks[1]["batches"] and ranks[2]["batches"] == ranks[3]["batches"]
    assert {lane for lane, _, _ in ranks[0]["batches"]} == {0, 1, 2, 3}
    assert {lane for lane, _, _ in ranks[2]["batches"]} == {4, 5, 6, 7}
