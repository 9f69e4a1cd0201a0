"""Each framework under ``torchrun --nproc-per-node 2`` (gloo, CPU): every lane trained exactly once,
(Lightning, accelerate) a resume from the step-6 checkpoint on the same ranks is exact, and (Hugging
Face, TRL) evaluations read every lane of the evaluation stream once, the ranks in step."""

from __future__ import annotations

import importlib.util
import json

import pytest

pytest.importorskip("transformers")
pytest.importorskip("pytorch_lightning")
pytest.importorskip("accelerate")

from tests.helpers.frameworks import SAVE_AT, STEPS, digest, hf_eval_pipeline  # noqa: E402
from tests.integrations.test_integrations_hf import stream  # noqa: E402
from tests.integrations.test_torchrun import torchrun  # noqa: E402

FRAMEWORKS = ("hf", "lightning", "accelerate")


@pytest.fixture(scope="module")
def ranks(corpus_dir, eval_corpus_dir, tmp_path_factory):
    """One launch runs every framework in turn (the imports are paid once); per rank, its results."""
    out = tmp_path_factory.mktemp("ddp")
    trl = ("trl",) if importlib.util.find_spec("trl") else ()
    torchrun(2, "--frameworks", *FRAMEWORKS, *trl, "--corpus", str(corpus_dir), "--eval-corpus", str(eval_corpus_dir),
             "--out", str(out), job="integrations_job.py", timeout=420)
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in range(2)]


@pytest.fixture(scope="module")
def dp1(corpus_dir):
    return sorted(stream(corpus_dir, 2 * STEPS))


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_two_ranks_train_the_dp1_stream_once(ranks, dp1, framework):
    inputs = [r[framework]["inputs"] for r in ranks]
    assert [len(i) for i in inputs] == [STEPS, STEPS]
    assert sorted(inputs[0] + inputs[1]) == dp1  # no lane missing, none trained twice


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["lightning", "accelerate"])
def test_two_ranks_resume_exactly(ranks, framework):
    for r in ranks:
        assert r[framework]["resumed"] == r[framework]["inputs"][SAVE_AT:]


@pytest.mark.slow
def test_hf_evaluates_every_lane_once_with_the_ranks_in_step(ranks, eval_corpus_dir):
    import torch

    hf = [r["hf"] for r in ranks]
    with hf_eval_pipeline(eval_corpus_dir) as held_out:
        dp1 = sorted(digest(torch.from_numpy(b["input_ids"])) for b in held_out)
    own = [r["own_batches"] for r in hf]
    assert sorted(own[0] + own[1]) == dp1  # each rank reads its own lanes: every batch once
    assert len(own[0]) != len(own[1])  # so one rank ends first, and runs blank batches until the other ends
    for r in hf:  # evaluations at steps 3 and 6 and the final one, each from the beginning
        assert [d for d in r["evaluated"] if d != "blank"] == r["own_batches"] * 3
        assert len(r["evaluated"]) == max(map(len, own)) * 3
    total, count = (sum(r["by_hand"][i] for r in hf) for i in range(2))
    for r in hf:  # the loss per label token over both ranks' batches, on every rank
        assert abs(r["eval_loss"] - total / count) <= 1e-6 * total / count


@pytest.mark.slow
def test_trl_evaluates_with_the_ranks_in_step(ranks):
    """TRL gathers its metrics at every evaluation batch: a rank with fewer batches must keep pace."""
    if "trl" not in ranks[0]:
        pytest.skip("trl is not installed")
    trl = [r["trl"] for r in ranks]
    assert len(trl[0]["own_batches"]) != len(trl[1]["own_batches"])
    total, count = (sum(r["by_hand"][i] for r in trl) for i in range(2))
    for r in trl:
        assert abs(r["eval_loss"] - total / count) <= 1e-6 * total / count
