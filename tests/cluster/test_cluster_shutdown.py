"""Closing the embedded cluster is quiet: a worker heartbeat that meets the closing scheduler
must not print a traceback (``_quiet_for_shutdown`` in execution/cluster.py, and the client
closing before the cluster it runs on)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

RUNS = 5
SCRIPTS = 4

SCRIPT = """
import sys
sys.path.insert(0, {root!r})
from pathlib import Path
from tests.helpers.pipelines import build

for run in range({runs}):
    with build(Path({corpus!r}), runner="distributed", n_workers=2) as p:
        for i, batch in zip(range(4), p):
            assert batch["tokens"].shape[0] == 3
    print("run", run, "done", flush=True)
"""


@pytest.mark.slow
def test_closing_the_embedded_cluster_prints_no_traceback(corpus_dir, tmp_path):
    # A script file, as a training job runs. Without the mitigation, about half the runs of such
    # a script started from a shell printed the traceback; started from Python (here), the race
    # showed up far more rarely, so this guards against a regression but cannot prove its absence.
    # Each script also exits while its last cluster still starts (its batches come from the head
    # start): the host and the scheduler are stopped under the starting nannies, which must stay
    # quiet too (before that was handled, about one script in three printed a traceback).
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(root=str(Path(__file__).resolve().parents[2]), runs=RUNS, corpus=str(corpus_dir)))
    for _ in range(SCRIPTS):
        out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-4000:]
        assert out.stdout.count("done") == RUNS, out.stdout
        assert "Traceback" not in out.stderr, out.stderr[-6000:]
        assert "Failed to communicate with scheduler during heartbeat" not in out.stderr, out.stderr[-6000:]
