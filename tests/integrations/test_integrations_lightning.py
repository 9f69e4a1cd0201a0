"""PyTorch Lightning fed by a pipeline: every checkpoint (also one Lightning writes between the
micro-batches of a step) resumes exactly, on the same or another DP degree, under Lightning's own
launcher; evaluation sees the same batches each time; wrong set-ups are refused."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pytorch_lightning")

import torch  # noqa: E402

from tests.helpers.frameworks import SAVE_AT, STEPS, hf_pipeline, lightning_fit, lightning_module  # noqa: E402
from zephon_dask.errors import ConfigError  # noqa: E402

PER_RANK = 4  # hf_pipeline: 4 lanes, a global step of 4 batches


def reference(corpus_dir, steps):
    """The uninterrupted dp=1 run: per global step, its batches ``(lane, index_in_lane)`` in order."""
    with hf_pipeline(corpus_dir) as pipe:
        batches = [(b.lane, b.index_in_lane) for b, _ in zip(pipe, range(steps * PER_RANK))]
    return [batches[s * PER_RANK:(s + 1) * PER_RANK] for s in range(steps)]


def trained(ref, first, last):
    """What a dp=1 fit trains from global step ``first`` to ``last``: ``(step, lane, index, batch_idx)``."""
    return [(s, lane, index, s * PER_RANK + i) for s in range(first, last) for i, (lane, index) in enumerate(ref[s])]


def test_every_checkpoint_resumes_exactly_and_evaluation_repeats(corpus_dir, tmp_path):
    """Resumed from ``step=4.ckpt`` into the same folder, Lightning saves step 4 again after one
    micro-batch (weights of step 4, one batch fetched and one trained since); that checkpoint
    resumes to the same batches, global steps and weights as the uninterrupted run. With dropout
    and no random generator code in the module: the data module saves the generators of step 4."""
    root = tmp_path / "ckpt"
    fit = {"steps": 8, "every": 4, "val_check_interval": 2 * PER_RANK, "check_val_every_n_epoch": None,
           "dropout": 0.1}
    with hf_pipeline(corpus_dir) as pipe, hf_pipeline(corpus_dir, seed=9) as val:
        full = lightning_fit(pipe, root, val_pipeline=val, **fit)
        val_stream = [(b.lane, b.index_in_lane) for b, _ in zip(val, range(3))]
    ref = reference(corpus_dir, 8)
    assert full.trainer.accumulate_grad_batches == PER_RANK  # set by the data module: one step, one global step
    assert full.trained == trained(ref, 0, 8)
    assert full.evaluations == [val_stream] * 4  # every 2 steps, the same first 3 batches, training undisturbed
    boundary = torch.load(root / "step=4.ckpt", weights_only=False)
    with hf_pipeline(corpus_dir) as pipe, hf_pipeline(corpus_dir, seed=9) as val:
        resumed = lightning_fit(pipe, root, resume=str(root / "step=4.ckpt"), val_pipeline=val, **fit)
    assert resumed.trained == trained(ref, 4, 8)
    assert resumed.seen == full.seen[4 * PER_RANK:]
    assert all(torch.equal(a, b) for a, b in zip(full.parameters(), resumed.parameters(), strict=True))
    mid_step = torch.load(root / "step=4.ckpt", weights_only=True)  # saved again, in place, mid-step
    assert mid_step["loops"]["fit_loop"]["epoch_loop.batch_progress"]["current"]["ready"] % PER_RANK
    data = mid_step["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]
    assert data == boundary["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]  # the weights' data state
    with hf_pipeline(corpus_dir) as pipe, hf_pipeline(corpus_dir, seed=9) as val:
        again = lightning_fit(pipe, tmp_path / "again", resume=str(root / "step=4.ckpt"), val_pipeline=val, **fit)
    assert again.trained == trained(ref, 4, 8)
    assert again.seen == full.seen[4 * PER_RANK:]
    assert again.evaluations == [val_stream] * 2
    for a, b in zip(full.parameters(), again.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_pipeline_handed_straight_to_fit_is_refused(corpus_dir, tmp_path):
    import pytorch_lightning as pl
    from torchdata.stateful_dataloader import StatefulDataLoader

    with hf_pipeline(corpus_dir) as pipe:
        for loader in (pipe.to_torch_loader(), pipe,
                       StatefulDataLoader(pipe.to_torch_dataset(), batch_size=None)):
            trainer = pl.Trainer(max_steps=2, accelerator="cpu", logger=False, enable_progress_bar=False,
                                 enable_model_summary=False, enable_checkpointing=False)
            with pytest.raises(ConfigError, match="datamodule=ZephonDataModule"):
                trainer.fit(lightning_module(), train_dataloaders=loader)  # at fit start, not at a resume


def test_accumulation_and_dataloader_iter_are_checked(corpus_dir, tmp_path):
    with hf_pipeline(corpus_dir) as pipe:
        with pytest.raises(ConfigError, match=f"set it to {PER_RANK}"):
            lightning_fit(pipe, tmp_path, steps=2, accumulate_grad_batches=2)

        class Fetching(type(lightning_module())):
            def training_step(self, dataloader_iter):
                return super().training_step(next(dataloader_iter)[0], 0)

        import pytorch_lightning as pl

        from zephon_dask.integrations.lightning import ZephonDataModule

        trainer = pl.Trainer(max_steps=2, accelerator="cpu", logger=False, enable_progress_bar=False,
                             enable_model_summary=False, enable_checkpointing=False)
        with pytest.raises(ConfigError, match="dataloader_iter"):
            trainer.fit(Fetching(), datamodule=ZephonDataModule(pipe))

        import zephon_dask as z
        from zephon_dask.integrations.lightning import StopOnPreemption

        with pytest.raises(ConfigError, match="at_once=True"):
            StopOnPreemption(z.Preemption())
        trainer = pl.Trainer(max_steps=2, accelerator="cpu", logger=False, enable_progress_bar=False,
                             enable_model_summary=False, enable_checkpointing=False,
                             callbacks=[StopOnPreemption(z.Preemption(at_once=True))])
        with pytest.raises(ConfigError, match="OnExceptionCheckpoint"):  # an interruption would save nothing
            trainer.fit(lightning_module(), datamodule=ZephonDataModule(pipe))


def launch(corpus_dir, out, *args, timeout=300) -> subprocess.CompletedProcess:
    """``python lightning_job.py`` (Lightning starts the second rank); the group is killed on a hang."""
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve().parents[1] / "jobs" / "lightning_job.py"), "--corpus", str(corpus_dir),
           "--out", str(out), *args]
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_PORT")}
    proc = subprocess.Popen(cmd, env={**env, "OMP_NUM_THREADS": "1"}, start_new_session=True, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        stdout, _ = proc.communicate(timeout=timeout)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # rank 1 too, whatever happened to rank 0
        except ProcessLookupError:
            pass
        proc.communicate()
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout)


@pytest.mark.slow
def test_lightning_launcher_ddp_resumes_exactly_on_two_ranks_and_on_one(corpus_dir, tmp_path):
    """``Trainer(devices=2, strategy="ddp")`` from ``python script.py``: identity from torch.distributed,
    accumulation sized after DDP is up; a mid-step checkpoint written at dp=2 resumes exactly at dp=1."""
    done = launch(corpus_dir, tmp_path)
    assert done.returncode == 0, done.stdout[-4000:]
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(2)]
    steps, every = STEPS // 2, SAVE_AT // 2
    ref = reference(corpus_dir, steps)
    for r, rank in enumerate(ranks):  # rank r: lanes 2r, 2r + 1; two batches per rank and global step
        assert [tuple(t) for t in rank["full"]] == [(s, lane, index, 2 * s + i) for s in range(steps)
                                                    for i, (lane, index) in enumerate(ref[s][2 * r:2 * r + 2])]
        assert rank["resumed"] == rank["full"][2 * every:]
    mid_step = tmp_path / "full" / f"step={every}.ckpt"  # saved again by the resumed fit, in place
    progress = torch.load(mid_step, weights_only=False)["loops"]["fit_loop"]["epoch_loop.batch_progress"]
    assert progress["current"]["ready"] % 2  # after the step's first micro-batch
    with hf_pipeline(corpus_dir) as pipe:  # dp=1: four batches per step
        one = lightning_fit(pipe, tmp_path / "dp1", resume=str(mid_step), steps=steps, every=every)
    assert one.trained == trained(ref, every, steps)


@pytest.mark.slow
def test_identity_from_environment_variables_is_refused_on_every_rank(corpus_dir, tmp_path):
    """Rank 0 of Lightning's launcher has no WORLD_SIZE: every rank raises, none hangs."""
    done = launch(corpus_dir, tmp_path, "--env-identity")
    assert done.returncode == 1, done.stdout[-4000:]
    errors = [(tmp_path / f"error-{r}.txt").read_text() for r in range(2)]
    assert errors[0] == errors[1]
    assert "dp_degree=1, dp_group_id=0" in errors[0] and "Leave dp_degree and dp_group_id unset" in errors[0]
