"""PyTorch Lightning fed by a pipeline: ``fit(ckpt_path=...)`` resumes exactly, also under DDP."""

from __future__ import annotations

import pytest

pytest.importorskip("pytorch_lightning")

from frameworks import SAVE_AT, STEPS, hf_pipeline, lightning_fit  # noqa: E402
from test_integrations_hf import stream  # noqa: E402


def test_fit_resumes_exactly_from_a_checkpoint(corpus_dir, tmp_path):
    with hf_pipeline(corpus_dir) as pipe:
        full = lightning_fit(pipe, tmp_path / "full", devices=1).seen
    assert full == stream(corpus_dir, STEPS)
    checkpoint = tmp_path / "full" / f"step={SAVE_AT}.ckpt"
    with hf_pipeline(corpus_dir) as pipe:
        resumed = lightning_fit(pipe, tmp_path / "resumed", resume=str(checkpoint), devices=1).seen
    assert resumed == full[SAVE_AT:]  # neither the prefetched batch 6 lost nor batches 0..5 replayed
