"""stats(), the plots and ``zephon-dask run`` against what was actually delivered."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.pipelines import build
from zephon_dask.cli import main as cli
from zephon_dask.core import compute_window

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "recipe.toml"


def test_step_history_keeps_the_last_steps_in_fixed_memory():
    """The per-step history is a ring of preallocated arrays: the same size from the first step
    (a long run's memory stays flat), the last ``capacity`` steps kept, oldest first."""
    from zephon_dask.state.history import StepHistory

    history = StepHistory(2, capacity=5)
    size = sum(a.nbytes for a in vars(history).values() if isinstance(a, np.ndarray) and a.base is None)
    rng = np.random.default_rng(0)
    expected = {}
    for batch in range(40):
        step = batch // 3
        real, tokens, samples = int(rng.integers(100)), rng.integers(0, 9, 2), rng.integers(0, 2, 2)
        history.add(step, real, 128, np.stack((tokens, samples)))
        e = expected.setdefault(step, {"global_step": step, "tokens": 0, "slots": 0,
                                       "dataset_tokens": np.zeros(2, int), "dataset_samples": np.zeros(2, int)})
        e["tokens"] += real
        e["slots"] += 128
        e["dataset_tokens"] = e["dataset_tokens"] + tokens
        e["dataset_samples"] = e["dataset_samples"] + samples
        kept = [expected[s] for s in sorted(expected)[-5:]]
        got = list(history)
        assert len(history) == len(got) == len(kept)
        for g, k in zip(got, kept, strict=True):
            assert {**g, "dataset_tokens": g["dataset_tokens"].tolist(), "dataset_samples": g["dataset_samples"].tolist()} \
                == {**k, "dataset_tokens": k["dataset_tokens"].tolist(), "dataset_samples": k["dataset_samples"].tolist()}
    assert sum(a.nbytes for a in vars(history).values() if isinstance(a, np.ndarray) and a.base is None) == size


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
    ax = pipe.stats().plot_mixture()
    assert len(ax.collections) == 2 and ax.get_xlabel() == "global step"  # one band per dataset
    line = pipe.stats().plot_packing().lines[0]
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


def test_a_stream_that_ends_mid_step_checkpoints_its_last_full_step(tmp_path, capsys):
    """The example recipe's stream, every sample kept, ends one batch into a global step: the
    checkpoint is the last full step's, with no warning, and a resume from it delivers that partial
    step again, then ends."""
    whole, resumed, ckpt = tmp_path / "whole", tmp_path / "resumed", tmp_path / "ckpt.json"
    every = tmp_path / "recipe.toml"
    every.write_text(EXAMPLE.read_text().replace('path = "data/', f'path = "{EXAMPLE.parent}/data/')
                     .replace("[options]", "[options]\ndrop_last_step = false", 1))
    common = [str(every), "--runner", "synchronous"]
    assert cli(["run", *common, "--steps", "1000", "--ledger", str(whole), "--checkpoint", str(ckpt)]) == 1
    out = capsys.readouterr()
    full = int(re.search(r"the stream ended after (\d+) full steps", out.out).group(1))
    assert f"checkpoint at global step {full} -> " in out.out and "warning" not in out.err, out.err
    partial = [line for line in (whole / "rank-0.jsonl").read_text().splitlines()
               if json.loads(line)["global_step"] == full]
    assert partial  # the stream did end inside a step
    assert cli(["run", *common, "--steps", "1", "--ledger", str(resumed), "--resume", str(ckpt)]) == 1
    assert "the stream ended after 0 full steps" in capsys.readouterr().out
    assert (resumed / "rank-0.jsonl").read_text().splitlines() == partial


def test_run_bar_shows_real_tokens_per_second(capsys):
    """docs/cli.md: the bar shows real (unpadded) tokens per second, not steps per second."""
    assert cli(["run", str(EXAMPLE), "--runner", "synchronous", "--steps", "3"]) == 0
    captured = capsys.readouterr()
    last = captured.err.replace("\r", "\n").strip().splitlines()[-1]
    assert re.search(r"3/3 \[.*, [\d,]+ tokens/s\]$", last), last
    assert "step/s" not in captured.err and "tokens delivered" in captured.out


def _drawn(spec, lane, window) -> Counter:
    """Oracle: the samples per dataset a window holds, from its computed rows (a document's first
    piece is its lineage row with token_start 0)."""
    out = compute_window(spec, lane, window)
    lineage = out.table.lineage
    return Counter(spec.source.names[d] for d in lineage[lineage[:, 3] == 0, 0].tolist())


@pytest.mark.parametrize("batches", [9, 37, 10_000])  # 10,000: to the stream's end
def test_stats_explain_shares_over_whole_windows_and_what_packing_holds(corpus_dir, batches):
    """Against windows computed here: the sample share over the windows delivered whole, and the
    documents of partly delivered windows not delivered yet; all of it still there after close."""
    # every sample: lanes then end where their data does (finished), as the shares below assume
    with build(corpus_dir, runner="synchronous", algorithm="best_fit", drop_last_step=False) as pipe:
        for _ in zip(range(batches), pipe):
            pass
        s = pipe.stats()
    spec = pipe.spec
    whole, entered, partial = Counter(), Counter(), 0
    ends = {lane["lane"]: spec.num_windows(lane["lane"]) if lane["finished"] else lane["window"] for lane in s.lanes}
    for lane in s.lanes:
        for w in range(ends[lane["lane"]]):
            whole += _drawn(spec, lane["lane"], w)
        if lane["offset"] and not lane["finished"]:
            partial += 1
            entered += _drawn(spec, lane["lane"], lane["window"])
    delivered = {m["dataset"]: m["samples"] for m in s.mixture}
    assert s.whole_windows == sum(ends.values()) and s.partial_windows == partial
    assert partial if batches < 100 else not partial
    assert {m["dataset"]: m["whole_window_share"] for m in s.mixture} == \
        {name: whole[name] / sum(whole.values()) if whole else None for name in ("web", "code")}
    assert {m["dataset"]: m["held"] for m in s.mixture} == \
        {name: whole[name] + entered[name] - delivered[name] if partial else 0 for name in ("web", "code")}
    if partial:
        assert "partly delivered" in str(s) and "best_fit emits long documents' full rows first" in str(s)
    # closed: the counters and rates of the last iteration stay as they were
    after = pipe.stats()
    assert after.packing_efficiency == s.packing_efficiency is not None
    assert (after.windows_done, after.windows_in_flight) == (s.windows_done, 0) and s.windows_done > 0
    assert after.elapsed_s == pipe.stats().elapsed_s and after.tokens_per_s > 0
    assert after.mixture == s.mixture
