"""Hugging Face Trainer fed by a pipeline: shapes, exact O(1) resume, DDP without re-sharding."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from frameworks import SAVE_AT, STEPS, digest, hf_pipeline, record_inputs, tiny_gpt2  # noqa: E402
from transformers import Trainer, TrainingArguments  # noqa: E402

from zephon_dask.errors import ConfigError, ShardingError, ZephonError  # noqa: E402
from zephon_dask.integrations.hf import STATE_FILE, ZephonTrainer  # noqa: E402


def args(out, **kw):
    kw = {"max_steps": STEPS, "save_strategy": "steps", "save_steps": SAVE_AT, **kw}
    return TrainingArguments(output_dir=str(out), learning_rate=1e-3, report_to=[], logging_strategy="no",
                             disable_tqdm=True, use_cpu=True, seed=0, dataloader_num_workers=0, **kw)


def train(corpus_dir, out, resume=None, **kw):
    model = tiny_gpt2()
    seen = record_inputs(model)
    with hf_pipeline(corpus_dir) as pipe:
        trainer = ZephonTrainer(model=model, args=args(out, **kw), train_dataset=pipe)
        trainer.train(resume_from_checkpoint=resume)
    return seen, model


def stream(corpus_dir, n, **options):
    """The first ``n`` batches of the pipeline's own iterator, as the model would receive them."""
    import torch

    with hf_pipeline(corpus_dir, **options) as pipe:
        return [digest(torch.from_numpy(b["input_ids"])) for b, _ in zip(pipe, range(n), strict=False)]


def test_trainer_receives_the_pipeline_stream_and_resumes_exactly(corpus_dir, tmp_path):
    full, model = train(corpus_dir, tmp_path / "full")
    assert full == stream(corpus_dir, STEPS)  # one pipeline batch per step, [microbatch, length]
    checkpoint = tmp_path / "full" / f"checkpoint-{SAVE_AT}"
    assert (checkpoint / STATE_FILE).is_file()
    resumed, model2 = train(corpus_dir, tmp_path / "resumed", resume=str(checkpoint))
    assert resumed == full[SAVE_AT:]  # no batch replayed, skipped or re-iterated
    for a, b in zip(model.parameters(), model2.parameters(), strict=True):
        assert (a == b).all()  # and the same weights at the end


def test_model_receives_hf_fields_with_batch_shape(corpus_dir, tmp_path):
    model = tiny_gpt2()
    shapes = []
    model.register_forward_pre_hook(lambda m, a, kw: shapes.append({k: tuple(v.shape) for k, v in kw.items()
                                                                     if hasattr(v, "shape")}), with_kwargs=True)
    with hf_pipeline(corpus_dir) as pipe:
        ZephonTrainer(model=model, args=args(tmp_path, max_steps=2, save_strategy="no"), train_dataset=pipe).train()
    assert set(shapes[0]) - {"num_items_in_batch"} == {"input_ids", "labels", "attention_mask", "position_ids"}
    assert all(len(s) == 2 and s[0] == 2 for shape in shapes for k, s in shape.items() if k != "num_items_in_batch")


def test_shifted_labels_are_refused(corpus_dir, tmp_path):
    with hf_pipeline(corpus_dir).batch(2, labels=True) as pipe:
        with pytest.raises(ConfigError, match="labels='hf'"):
            ZephonTrainer(model=tiny_gpt2(), args=args(tmp_path), train_dataset=pipe)


def test_stock_trainer_on_the_dataset_is_refused(corpus_dir, tmp_path):
    """The stock Trainer hands the dataset to accelerate's dispatcher, which would re-split it."""
    with hf_pipeline(corpus_dir) as pipe:
        trainer = Trainer(model=tiny_gpt2(), args=args(tmp_path, max_steps=2, save_strategy="no"),
                          train_dataset=pipe.to_torch_dataset())
        with pytest.raises(ShardingError, match="ZephonTrainer") as info:
            trainer.train()
    assert isinstance(info.value, ZephonError) and isinstance(info.value, RuntimeError)
