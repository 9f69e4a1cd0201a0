"""examples/slurm/train.sbatch run as written on 127.0.0.1: its Dask scheduler and worker, a training
rank on the scheduler file, SLURM's early-warning signal, the checkpoint, the requeue, a resume."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

import zephon_dask as z

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 180.0  # seconds for any one wait: the scheduler, the worker and the rank start on a busy host

# SLURM's commands, as one node: srun runs its command here (its options, all --name=value, dropped),
# scontrol names this host and records a requeue, torchrun runs the script in one process
SHIMS = {
    "srun": '#!/bin/bash\nwhile [ $# -gt 0 ] && [ "${1#--}" != "$1" ]; do shift; done\nexec "$@"\n',
    "scontrol": '#!/bin/bash\nif [ "$1" = show ]; then echo 127.0.0.1; else echo "$@" >> "$SHARED/scontrol.log"; fi\n',
    "torchrun": ('#!/bin/bash\nwhile [ $# -gt 0 ] && [ "${1#--}" != "$1" ]; do shift; done\n'
                 f'exec {sys.executable} "$@"\n'),
}


def load_train():
    spec = importlib.util.spec_from_file_location("example_cluster_train", ROOT / "examples" / "clusters" / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_sbatch_script_checkpoints_requeues_on_its_signal_and_a_resume_finishes(tmp_path, capsys):
    bin_dir, shared = tmp_path / "bin", tmp_path / "shared"
    bin_dir.mkdir()
    for name, text in SHIMS.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}",
           "PYTHONPATH": str(ROOT), "SHARED": str(shared), "STEPS": "40", "SLURM_JOB_ID": "77",
           "SLURM_NNODES": "1", "SLURM_JOB_NODELIST": "node1", "DASK_WORKERS_PER_NODE": "1",
           "DASHBOARD_PORT": "0"}
    log = tmp_path / "stderr.txt"
    with log.open("w") as err:
        job = subprocess.Popen(["bash", str(ROOT / "examples" / "slurm" / "train.sbatch")], cwd=ROOT, env=env,
                               stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True)
    lines: list[str] = []
    started = threading.Event()

    def read() -> None:
        for line in job.stdout:
            lines.append(line)
            if line.startswith("training from global step 0"):
                started.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert started.wait(LIMIT), f"the training rank did not start: {lines}"
        job.send_signal(signal.SIGUSR1)  # what --signal=B:USR1@300 sends before the time limit
        status = job.wait(timeout=LIMIT)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.pid, signal.SIGKILL)  # only if a wait above failed: the session is empty by now
        job.wait(timeout=60)
    reader.join(timeout=60)

    out = "".join(lines) + "".join(line for line in log.read_text().splitlines(keepends=True)[-40:]
                                   if not line.startswith("20"))  # stderr's last lines, Dask's log left out
    ckpt = shared / "ckpt"
    assert status == 143, out
    step = (ckpt / "latest").read_text()
    assert step == "step-1" and f"stopped at {step}: requeued" in out, out
    assert (shared / "scontrol.log").read_text() == "requeue 77\n"
    assert not (ckpt / "done").exists() and not (shared / "scheduler-77.json").exists()
    deadline = time.monotonic() + 60  # the scheduler and the worker were stopped before the script exited
    while (left := [p for p in psutil.process_iter(["pid"]) if _in_session(p, job.pid)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, left
    assert z.load_state(ckpt / step / "data.json")["step"]["global_step"] == 1

    capsys.readouterr()
    train = load_train()  # the requeued job, on one rank without a cluster: it resumes at step 1
    assert train.main(["--threads", "--ckpt", str(ckpt), "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("training from global step 1 to 2\n") and "global step 2:" in out, out
    assert (ckpt / "latest").read_text() == "step-2" and (ckpt / "done").read_text() == "2\n"
    assert sorted(p.name for p in ckpt.glob("step-*")) == ["step-1", "step-2"]


def _in_session(proc: psutil.Process, sid: int) -> bool:
    try:
        return os.getsid(proc.pid) == sid
    except (ProcessLookupError, PermissionError):
        return False
