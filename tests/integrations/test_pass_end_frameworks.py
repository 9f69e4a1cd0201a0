"""Lightning and accelerate at the end of a pass: every optimizer step trains the same number of
micro-batches (``drop_last_step``, the default), over a pass that is not whole steps.

The Hugging Face ``Trainer``'s case is in test_integrations_hf.py
(``test_no_optimizer_step_trains_an_odd_number_of_micro_batches``), with the same stream: 2 lanes
of 4 and 5 micro-batches, 4 per global step (2 of each lane), so a pass holds 2 whole steps and
one batch more.
"""

from __future__ import annotations

import warnings
from collections import Counter

import pytest
import torch

import zephon_dask as z
from tests.helpers.frameworks import MODEL_FIELDS, lightning_module, tiny_gpt2
from tests.helpers.pipelines import write_corpus


def stream(tmp_path, drop_last_step: bool):
    root = write_corpus(tmp_path / "web", n_files=1, docs=4, seed=7)
    source = z.MixtureWorkSource([z.Dataset.from_jsonl("web", str(root), progress=False)], chunk_size=1, seed=0)
    return z.Pipeline(source).tokenize().pack(128, algorithm="wrap").batch(1, labels="hf").options(
        canonical_replicas=2, global_batches_per_step=4, runner="synchronous", drop_last_step=drop_last_step)


def forwards_counter(model) -> list[int]:
    """A one-element list counting the model's training forwards (reset by the caller)."""
    count = [0]
    model.register_forward_pre_hook(lambda m, a: count.__setitem__(0, count[0] + m.training))
    return count


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: threads only contend
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the batch each pass drops, and the frameworks' own advice
        yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("drop_last_step", [True, False])
def test_lightning_steps_the_optimizer_on_whole_steps_only(tmp_path, drop_last_step):
    """Lightning steps the optimizer on an epoch's last batch: keeping every sample, the pass's
    ninth micro-batch is a step of its own."""
    pl = pytest.importorskip("pytorch_lightning")
    from zephon_dask.integrations.lightning import ZephonDataModule

    module = lightning_module()  # records each training batch with the optimizer steps taken before it
    trainer = pl.Trainer(max_steps=3, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, num_sanity_val_steps=0,
                         default_root_dir=str(tmp_path))
    with stream(tmp_path, drop_last_step) as pipe:
        assert pipe.num_steps() == 2
        trainer.fit(module, datamodule=ZephonDataModule(pipe))
    per_step = list(Counter(step for step, _, _, _ in module.trained).values())
    assert per_step == ([4, 4, 4] if drop_last_step else [4, 4, 1])


@pytest.mark.parametrize("drop_last_step", [True, False])
def test_accelerate_accumulates_whole_steps_only(tmp_path, drop_last_step):
    """accelerate counts micro-batches across epochs: keeping every sample, the pass's ninth joins
    the next pass's first three, and every later step is shifted against the pipeline's."""
    pytest.importorskip("accelerate")
    from accelerate import Accelerator

    from zephon_dask.integrations.accelerate import prepare_pipeline

    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=4)
    model = tiny_gpt2()
    count = forwards_counter(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    per_step: list[tuple[int, tuple[int, int]]] = []  # forwards, and where the pipeline's steps stand
    with stream(tmp_path, drop_last_step) as pipe:
        loader = prepare_pipeline(accelerator, pipe)
        for _ in range(2):  # epochs
            for batch in loader:
                with accelerator.accumulate(model):
                    accelerator.backward(model(**{k: batch[k] for k in MODEL_FIELDS}).loss)
                    optimizer.step()
                    optimizer.zero_grad()
                if accelerator.sync_gradients:
                    at = pipe.state_dict()["step"]
                    per_step.append((count[0], (at["global_step"], at["batches_in_step"])))
                    count[0] = 0
    if drop_last_step:
        assert per_step == [(4, (step, 0)) for step in (1, 2, 3, 4)]  # each optimizer step a global step
    else:  # the third: the pass's last batch and the next pass's first 3 (its step 3 holds 3 so far)
        assert per_step == [(4, (1, 0)), (4, (2, 0)), (4, (3, 3)), (4, (4, 3))]
