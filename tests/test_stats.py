"""stats(), the plots and ``zephon-dask run`` against what was actually delivered."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from pipelines import build

from zephon_dask.cli import main as cli

EXAMPLE = Path(__file__).parent.parent / "examples" / "recipe.toml"


def test_stats_count_what_was_delivered(corpus_dir):
    pipe = build(corpus_dir, runner="synchronous", batches_per_step=4)
    before = pipe.stats()
    assert before.batches == before.tokens == 0 and before.padding_efficiency is None
    it = iter(pipe)
    batches = [next(it) for _ in range(22)]
    s = pipe.stats()
    real = sum(int((b["document_ids"] >= 0).sum()) for b in batches)  # packed rows may hold padding
    slots = sum(b["tokens"].size for b in batches)
    per_dataset, started = Counter(), Counter()
    for b in batches:
        for row in range(b.num_samples):
            for dataset, _, _, token_start, count in b.sources(row):
                per_dataset[dataset] += count
                started[dataset] += token_start == 0
    assert (s.batches, s.tokens, s.global_step) == (22, real, 5)
    assert s.padding_efficiency == pytest.approx(real / slots)
    assert {m["dataset"]: m["tokens"] for m in s.mixture} == dict(per_dataset)
    assert {m["dataset"]: m["samples"] for m in s.mixture} == dict(started)
    assert [m["target"] for m in s.mixture] == [m["sample_target"] for m in s.mixture] == [0.75, 0.25]
    assert [m["realized"] for m in s.mixture] == [started[n] / sum(started.values()) for n in ("web", "code")]
    assert [m["token_share"] for m in s.mixture] == [per_dataset[n] / real for n in ("web", "code")]
    assert [m["token_target"] for m in s.mixture] == [None, None]  # weighted by samples: no token target
    assert "sample target" in str(s) and "weighted by samples" in str(s)
    assert [h["global_step"] for h in s.history] == [0, 1, 2, 3, 4, 5]
    assert sum(h["tokens"] for h in s.history) == real
    assert [lane["batches_delivered"] for lane in s.lanes] == [6, 6, 5, 5]
    assert s.windows_done >= 4 and 0 < s.packing_efficiency <= 1
    assert "tokens/s" in str(s) and "<table" in s._repr_html_()
    pipe.close()


def test_plots_draw_the_history(corpus_dir):
    import matplotlib

    matplotlib.use("Agg")
    pipe = build(corpus_dir, runner="synchronous")
    it = iter(pipe)
    for _ in range(40):
        next(it)
    ax = pipe.plot_mixture()
    assert len(ax.collections) == 2 and ax.get_xlabel() == "global step"  # one band per dataset
    line = pipe.plot_packing().lines[0]
    assert np.allclose(line.get_ydata(), [h["tokens"] / h["slots"] for h in pipe.stats().history])


def test_run_command_checkpoints_resumes_and_verifies(tmp_path, capsys):
    ledger, ckpt = tmp_path / "split", tmp_path / "ckpt.json"
    common = [str(EXAMPLE), "--runner", "synchronous"]
    assert cli(["run", *common, "--steps", "12", "--ledger", str(tmp_path / "whole")]) == 0
    assert cli(["run", *common, "--steps", "5", "--ledger", str(ledger), "--checkpoint", str(ckpt)]) == 0
    assert "checkpoint at global step 5" in capsys.readouterr().out
    assert cli(["run", *common, "--steps", "7", "--ledger", str(ledger), "--resume", str(ckpt),
                "--dp-degree", "1"]) == 0
    capsys.readouterr()
    assert cli(["verify", str(tmp_path / "whole"), str(ledger)]) == 0
    assert "12 global steps" in capsys.readouterr().out
    assert cli(["run", str(EXAMPLE), "--steps", "1", "--resume", str(tmp_path / "nope.json")]) == 2
    assert "no checkpoint" in capsys.readouterr().err
