"""Shared by the framework tests and their torchrun jobs: tiny models from config, a recorder."""

from __future__ import annotations

import hashlib

from tests.helpers.pipelines import build

VOCAB = 258  # the bytes tokenizer: 256 bytes, BOS, EOS
STEPS, SAVE_AT = 12, 6


def hf_pipeline(corpus_dir, batch=None, **options):
    """Four lanes, micro-batches of two rows of at most 96 tokens, Hugging Face labels (``batch``:
    other ``.batch()`` arguments)."""
    options.setdefault("runner", "synchronous")
    return build(corpus_dir, R=4, k=1, microbatch=None, **options).batch(
        **{"microbatch_size": 2, "labels": "hf", **(batch or {})})


def tiny_gpt2(seed: int = 0, dropout: float = 0.0):
    """The tiny GPT-2; with ``dropout`` > 0 a resume is exact only if the random generators are."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=VOCAB, n_positions=128, n_embd=16, n_layer=1, n_head=2, bos_token_id=256,
                        eos_token_id=257, resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
                        tie_word_embeddings=False)
    return GPT2LMHeadModel(config)


def digest(tensor) -> str:
    """What a step trained on, as bytes: shape and values."""
    t = tensor.detach().cpu().contiguous()
    return hashlib.sha256(repr(tuple(t.shape)).encode() + t.numpy().tobytes()).hexdigest()[:16]


def record_inputs(model) -> list[str]:
    """Digests of every ``input_ids`` the model's forward receives (training forwards only)."""
    seen: list[str] = []

    def hook(module, args, kwargs):
        if module.training:
            ids = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
            seen.append(digest(ids))

    model.register_forward_pre_hook(hook, with_kwargs=True)
    return seen


MODEL_FIELDS = ("input_ids", "labels", "attention_mask", "position_ids")


def lightning_module(dropout: float = 0.0):
    """A LightningModule around the tiny GPT-2 (no random generator code of its own). It records its
    training inputs (``.seen``: digests), each training batch as ``(global step, lane,
    index_in_lane, batch_idx)`` (``.trained``) and each evaluation's batches as ``(lane,
    index_in_lane)`` lists (``.evaluations``)."""
    import pytorch_lightning as pl
    import torch

    class TinyLM(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = tiny_gpt2(dropout=dropout)
            self.seen = record_inputs(self.model)
            self.trained: list[tuple[int, int, int, int]] = []
            self.evaluations: list[list[tuple[int, int]]] = []

        def training_step(self, batch, batch_idx):
            self.trained.append((self.trainer.global_step, int(batch["lane"]), int(batch["index_in_lane"]),
                                 batch_idx))
            return self.model(**{k: batch[k] for k in MODEL_FIELDS}).loss

        def on_validation_epoch_start(self):
            self.evaluations.append([])

        def validation_step(self, batch, batch_idx):
            self.evaluations[-1].append((int(batch["lane"]), int(batch["index_in_lane"])))

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    return TinyLM()


def lightning_fit(pipeline, root, resume=None, steps=STEPS, every=SAVE_AT, val_pipeline=None, dropout=0.0,
                  **trainer_kw):
    """Fit ``steps`` optimizer steps (global steps of the pipeline), checkpointing every ``every``
    into ``root``; returns the module (``module.trainer`` is its trainer)."""
    import pytorch_lightning as pl
    from pytorch_lightning.callbacks import ModelCheckpoint

    from zephon_dask.integrations.lightning import ZephonDataModule

    module = lightning_module(dropout)
    checkpoints = ModelCheckpoint(dirpath=str(root), every_n_train_steps=every, save_top_k=-1,
                                  filename="{step}")
    trainer_kw.setdefault("limit_val_batches", 0 if val_pipeline is None else 3)
    trainer = pl.Trainer(max_steps=steps, accelerator="cpu", logger=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[checkpoints], num_sanity_val_steps=0,
                         **trainer_kw)
    trainer.fit(module, datamodule=ZephonDataModule(pipeline, val_pipeline=val_pipeline), ckpt_path=resume)
    return module


def accelerate_run(pipeline_factory, root) -> tuple[list[str], list[str]]:
    """``STEPS`` steps with ``save_state`` after ``SAVE_AT``, then a fresh model, pipeline and
    loader resumed with ``load_state``; returns what the model trained on in each run."""
    import torch
    from accelerate import Accelerator

    from zephon_dask.integrations.accelerate import prepare_pipeline

    def run(steps, load=None):
        accelerator = Accelerator(cpu=True)
        model = tiny_gpt2()
        seen = record_inputs(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model, optimizer = accelerator.prepare(model, optimizer)
        with pipeline_factory() as pipe:
            loader = prepare_pipeline(accelerator, pipe)
            if load is not None:
                accelerator.load_state(load)
            for step, batch in zip(range(steps), loader, strict=False):
                loss = model(**{k: batch[k] for k in MODEL_FIELDS}).loss
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
                if step + 1 == SAVE_AT and load is None:
                    accelerator.save_state(str(root))
        return seen

    full = run(STEPS)
    return full, run(STEPS - SAVE_AT, load=str(root))


def hf_eval_pipeline(eval_dir, microbatch: int = 2, **options):
    """A finite evaluation stream: one pass over a small corpus, four lanes, Hugging Face labels."""
    import zephon_dask as z

    options.setdefault("runner", "synchronous")
    held_out = z.Dataset.from_jsonl("held_out", str(eval_dir), progress=False)
    source = z.MixtureWorkSource([held_out], chunk_size=4, seed=7, stop_after_passes=1)
    pipeline = (z.Pipeline(source).tokenize().pack(96).batch(microbatch, labels="hf")
                .options(canonical_replicas=4, flush_every_k_chunks=1, **options))
    pipeline.session.serve_evaluation()  # every sample, also where a test reads it by hand
    return pipeline


def hand_eval(model, pipeline) -> tuple[float, int, list[str]]:
    """Oracle for eval_loss: over the pipeline's own batches (this rank's lanes), the summed cross
    entropy of every label token (the model's logits, labels shifted by hand, in float64), the
    number of label tokens, and the batches' digests."""
    import torch
    import torch.nn.functional as F

    model.eval()
    total, count, seen = 0.0, 0, []
    with torch.no_grad():
        for batch in pipeline.to_torch():
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                           position_ids=batch["position_ids"]).logits
            target = batch["labels"][:, 1:]
            keep = target != -100
            total += F.cross_entropy(logits[:, :-1][keep].double(), target[keep], reduction="sum").item()
            count += int(keep.sum())
            seen.append(digest(batch["input_ids"]))
    return total, count, seen


def record_eval_inputs(model) -> list[str]:
    """Digests of every ``input_ids`` the model's forward receives in evaluation mode; ``"blank"`` for a
    batch without label tokens (what a rank whose evaluation stream ended runs while others go on)."""
    seen: list[str] = []

    def hook(module, args, kwargs):
        if not module.training:
            labels = kwargs.get("labels")
            blank = labels is not None and bool((labels == -100).all())
            seen.append("blank" if blank else digest(kwargs["input_ids"] if "input_ids" in kwargs else args[0]))

    model.register_forward_pre_hook(hook, with_kwargs=True)
    return seen


def end_process_group_after(main) -> int:
    """``main()``'s exit code, this rank's process group ended after it however it ends: gloo
    threads left running at exit may abort the process (SIGABRT); torch asks for this."""
    import torch.distributed

    try:
        return main()
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
