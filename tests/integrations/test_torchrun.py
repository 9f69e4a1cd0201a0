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


def test_every_rank_ends_a_packed_pass_on_the_step_one_process_ends_it(tmp_path):
    """Packed lanes of 31, 34, 26 and 31 batches, one batch per lane a step: every pass is the 26
    steps every lane completes. Two ranks (whose own lanes would go on to steps 31 and 26) run a
    pass and save at its end; four resume there for two more passes: each rank votes at every
    step's start, and the ledger equals one process's over three passes."""
    import warnings

    from tests.helpers.pipelines import write_corpus
    from tests.jobs.pass_end_job import pipeline

    corpus = tmp_path / "corpus"
    write_corpus(corpus / "web", 2, 24, 1, "web")
    write_corpus(corpus / "code", 1, 24, 2, "code")
    every = pipeline(corpus, None).options(drop_last_step=False)
    with every:
        assert [sum(1 for b in every if b.lane == lane) for lane in range(4)] == [31, 34, 26, 31]
    truth = pipeline(corpus, str(tmp_path / "truth"))
    assert truth.num_steps() == 26
    with truth, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the batches each pass drops, warned
        for _ in range(3):
            assert sum(1 for _ in truth) == 26 * 4
    ckpt = tmp_path / "ckpt.json"
    common = ["--corpus", str(corpus), "--ledger", str(tmp_path / "run")]
    torchrun(2, *common, "--passes", "3", "--save-at", "26", "--save", str(ckpt), job="pass_end_job.py")
    torchrun(4, *common, "--passes", "2", "--resume", str(ckpt), job="pass_end_job.py")
    assert cli(["verify", str(tmp_path / "truth"), str(tmp_path / "run")]) == 0
    steps = {json.loads(line)["global_step"] for r in range(4)
             for line in (tmp_path / "run" / f"rank-{r}.jsonl").read_text().splitlines()}
    assert steps == set(range(3 * 26))
