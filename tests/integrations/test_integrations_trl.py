"""TRL's SFTTrainer fed by ``tokenize_chat`` pipelines through ``ZephonTrainerMixin``: the packed rows it
trains on (labels only on the assistant's tokens, positions restarting per document), its loss against a
hand computation, evaluation, and an exact resume from ``checkpoint-N``.

Oracles: ``transformers``' ``apply_chat_template`` (its ``assistant_masks``, through test_chat's
``reference_batch``), the positions rebuilt from the batch's documents, cross entropy from the logits.
"""

# ruff: noqa: F401, F811 (test_chat's fixtures, imported by name, are the tests' arguments)
from __future__ import annotations

import copy
import math

import numpy as np
import pytest

pytest.importorskip("trl")

import torch  # noqa: E402
from trl import SFTConfig, SFTTrainer  # noqa: E402

import zephon_dask as z  # noqa: E402
from tests.helpers.frameworks import hand_eval, record_eval_inputs  # noqa: E402
from tests.unit.test_chat import (  # noqa: E402
    CHATML_GENERATION,
    bpe,
    chat_dir,
    chat_pipeline,
    hf_tokenizer,
    reference_batch,
)
from zephon_dask.errors import ConfigError  # noqa: E402
from zephon_dask.integrations.hf import STATE_FILE, ZephonTrainerMixin  # noqa: E402

STEPS, SAVE_AT = 4, 2  # optimizer steps; the chat pipeline has 2 lanes: 2 batches per step
PER_STEP = 2


class SFT(ZephonTrainerMixin, SFTTrainer):
    """What a user writes: TRL's trainer, fed by pipelines."""


def tiny_model(vocab: int):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_positions=128, n_embd=16, n_layer=1, n_head=2,
                                      bos_token_id=1, eos_token_id=2, resid_pdrop=0.0, embd_pdrop=0.0,
                                      attn_pdrop=0.0, tie_word_embeddings=False))


def config(out, **kw):
    return SFTConfig(output_dir=str(out), max_steps=STEPS, save_steps=SAVE_AT, learning_rate=1e-3, report_to=[],
                     logging_steps=1, disable_tqdm=True, use_cpu=True, seed=0, bf16=False,
                     gradient_checkpointing=False, dataloader_num_workers=0, **kw)


def held_out(chat_dir, bpe):
    """A finite evaluation stream: the dialog conversations once."""
    dialog = z.Dataset.from_jsonl("dialog", str(chat_dir / "dialog"), text_field="messages", progress=False)
    return (z.Pipeline(z.MixtureWorkSource([dialog], chunk_size=8, seed=9))
            .tokenize_chat(hf_tokenizer(bpe, CHATML_GENERATION), max_length=150).pack(128, algorithm="best_fit")
            .batch(2, labels="hf").options(canonical_replicas=2, flush_every_k_chunks=2, runner="synchronous"))


def record_training_inputs(model) -> list[dict]:
    seen: list[dict] = []

    def hook(module, args, kwargs):
        if module.training:
            seen.append({k: kwargs[k].detach().clone() for k in ("input_ids", "labels", "position_ids")})

    model.register_forward_pre_hook(hook, with_kwargs=True)
    return seen


def run(chat_dir, bpe, out, resume=None):
    model = tiny_model(bpe.get_vocab_size())
    initial = copy.deepcopy(model)
    seen, evaluated = record_training_inputs(model), record_eval_inputs(model)
    with chat_pipeline(chat_dir, bpe, labels="hf") as pipe, held_out(chat_dir, bpe) as evaluation:
        trainer = SFT(model=model, args=config(out, eval_strategy="steps", eval_steps=SAVE_AT), train_dataset=pipe,
                      eval_dataset=evaluation, processing_class=hf_tokenizer(bpe, CHATML_GENERATION))
        trainer.train(resume_from_checkpoint=resume)
        evaluated = list(evaluated)
        by_hand = hand_eval(model, evaluation)
    return {"trainer": trainer, "initial": initial, "seen": seen, "evaluated": evaluated, "by_hand": by_hand,
            "history": trainer.state.log_history}


@pytest.fixture(scope="module")
def full(chat_dir, bpe, tmp_path_factory):
    out = tmp_path_factory.mktemp("sft")
    return {"out": out, **run(chat_dir, bpe, out)}


def test_sft_trains_on_packed_rows_with_assistant_labels_and_document_positions(full, chat_dir, bpe):
    hf = hf_tokenizer(bpe, CHATML_GENERATION)
    assert full["trainer"].args.gradient_accumulation_steps == PER_STEP
    assert len(full["seen"]) == STEPS * PER_STEP
    restarts = 0
    with chat_pipeline(chat_dir, bpe, labels="hf") as pipe:
        for batch, got in zip(pipe, full["seen"]):
            _, labels = reference_batch(batch, pipe, hf)  # labels on the assistant's tokens only
            assert (got["input_ids"].numpy() == batch["input_ids"]).all()
            assert (got["labels"].numpy() == labels).all()
            docs = batch["document_ids"]
            for row, positions in zip(docs, got["position_ids"].numpy()):
                starts = np.flatnonzero((row >= 0) & (np.r_[-2, row[:-1]] != row))
                want = np.arange(len(row)) - starts[np.searchsorted(starts, np.arange(len(row)), "right") - 1]
                assert (positions[row >= 0] == want[row >= 0]).all()  # 0 at each document's first token
                restarts += len(starts) - 1
    assert restarts > 0  # rows hold several documents
    trained = torch.cat([s["labels"] for s in full["seen"]])
    assert (trained == -100).any() and (trained != -100).any()  # the user turns are not trained


def test_sft_loss_is_the_cross_entropy_of_the_assistant_tokens(full, chat_dir, bpe):
    """Step 1's logged loss from the initial weights, by hand: every label token of its two batches."""
    model = full["initial"]
    total, count = 0.0, 0
    with torch.no_grad():
        for inputs in full["seen"][:PER_STEP]:
            logits = model(input_ids=inputs["input_ids"], position_ids=inputs["position_ids"]).logits
            target = inputs["labels"][:, 1:]
            keep = target != -100
            total += torch.nn.functional.cross_entropy(logits[:, :-1][keep].double(), target[keep],
                                                       reduction="sum").item()
            count += int(keep.sum())
    first = next(h for h in full["history"] if h["step"] == 1 and "loss" in h)
    assert math.isclose(first["loss"], total / count, rel_tol=1e-5)


def test_sft_evaluates_the_pipeline_and_resumes_exactly(full, chat_dir, bpe, tmp_path):
    total, count, batches = full["by_hand"]
    assert full["evaluated"] == batches * (STEPS // SAVE_AT)  # each evaluation from the beginning
    final = {h["step"]: h for h in full["history"] if "eval_loss" in h}
    assert math.isclose(final[STEPS]["eval_loss"], total / count, rel_tol=1e-6)
    assert "eval_mean_token_accuracy" in final[STEPS]  # TRL's own evaluation metrics still come

    checkpoint = full["out"] / f"checkpoint-{SAVE_AT}"
    assert (checkpoint / STATE_FILE).is_file()
    resumed = run(chat_dir, bpe, tmp_path, resume=str(checkpoint))
    assert len(resumed["seen"]) == (STEPS - SAVE_AT) * PER_STEP
    for a, b in zip(resumed["seen"], full["seen"][SAVE_AT * PER_STEP:], strict=True):
        assert all(torch.equal(a[k], b[k]) for k in a)
    for a, b in zip(full["trainer"].model.parameters(), resumed["trainer"].model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert {h["step"]: h["eval_loss"] for h in resumed["history"] if "eval_loss" in h}[STEPS] == \
        final[STEPS]["eval_loss"]


@pytest.mark.parametrize("setting", ["packing", "assistant_only_loss"])
def test_trl_data_preparation_settings_are_refused(chat_dir, bpe, tmp_path, setting):
    with chat_pipeline(chat_dir, bpe, labels="hf") as pipe:
        with pytest.raises(ConfigError, match=f"{setting}=False"):
            SFT(model=tiny_model(bpe.get_vocab_size()), args=config(tmp_path, **{setting: True}),
                train_dataset=pipe, processing_class=hf_tokenizer(bpe, CHATML_GENERATION))
