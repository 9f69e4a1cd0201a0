"""Each framework under ``torchrun --nproc-per-node 2`` (gloo, CPU): every lane trained exactly once,
and (Lightning, accelerate) a resume from the step-6 checkpoint on the same ranks is exact."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")
pytest.importorskip("pytorch_lightning")
pytest.importorskip("accelerate")

from frameworks import SAVE_AT, STEPS  # noqa: E402
from test_integrations_hf import stream  # noqa: E402
from test_torchrun import torchrun  # noqa: E402

FRAMEWORKS = ("hf", "lightning", "accelerate")


@pytest.fixture(scope="module")
def ranks(corpus_dir, tmp_path_factory):
    """One launch runs every framework in turn (the imports are paid once); per rank, its results."""
    out = tmp_path_factory.mktemp("ddp")
    torchrun(2, "--frameworks", *FRAMEWORKS, "--corpus", str(corpus_dir), "--out", str(out),
             job="integrations_job.py", timeout=420)
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
