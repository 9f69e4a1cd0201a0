"""``zephon-dask demo`` end to end, small: train, checkpoint, resume on dp=2, verify the ledgers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from zephon_dask.cli import main

EXE = Path(sys.executable).parent / "zephon-dask"


def test_demo_resumes_on_dp2_with_the_same_global_steps(tmp_path):
    done = subprocess.run([str(EXE), "demo", "--workdir", str(tmp_path), "--steps", "4", "--max-files", "12"],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert ("dp=1 -> checkpoint at step 2 -> dp=2: global steps 0..3 match the uninterrupted run "
            "(16 batches)") in done.stdout
    assert done.stdout.count("dashboard http") == 1
    assert done.stderr.count("zephon_dask: Dask dashboard at http") == 1  # at the cluster's start
    assert (tmp_path / "tokenizer.json").exists() and (tmp_path / "ckpt" / "model.pt").exists()
    state = json.loads((tmp_path / "ckpt" / "data.json").read_text())["state"]
    assert state["step"]["global_step"] == 2 and sorted(state["lanes"], key=int) == ["0", "1", "2", "3"]
    elastic = sorted(p.name for p in (tmp_path / "runs" / "elastic").iterdir())
    assert elastic == ["rank-0.jsonl", "rank-1.jsonl"]


def test_demo_refuses_a_degree_that_does_not_divide_the_lanes(tmp_path, capsys):
    assert main(["demo", "--workdir", str(tmp_path / "w"), "--dp-after", "3"]) == 2
    assert "dp_after=3 must divide" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()


def test_demo_is_a_package_beside_the_library(tmp_path):
    code = "import sys, zephon_dask; print('zephon_dask_demo' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"
    done = subprocess.run([sys.executable, "-m", "zephon_dask_demo", "--workdir", str(tmp_path / "w"),
                           "--dp-after", "3"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "dp_after=3 must divide" in done.stderr
