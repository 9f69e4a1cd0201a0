"""Train a tiny Llama with PyTorch Lightning on a zephon_dask pipeline.

    python examples/frameworks/lightning_fit.py --steps 12 --out runs/pl
    python examples/frameworks/lightning_fit.py --steps 24 --out runs/pl --resume runs/pl/step=12.ckpt
    python examples/frameworks/lightning_fit.py --devices 2 --steps 12 --out runs/pl-ddp
    torchrun --nproc-per-node 2 examples/frameworks/lightning_fit.py --devices 2 --steps 12 --out runs/pl-ddp

Lightning saves the data module's loader state in every checkpoint and
``fit(ckpt_path=...)`` restores it: the resumed run trains on the batches
after the last ones the saved weights trained on, with no state code here.
Nothing here sets the rank or the gradient accumulation: the pipeline takes
its rank from ``torch.distributed`` once Lightning (or torchrun) starts it,
and the data module sets ``accumulate_grad_batches`` to one global step.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint
from transformers import LlamaConfig, LlamaForCausalLM

import zephon_dask as z
from zephon_dask.integrations.lightning import ZephonDataModule

RECIPE = Path(__file__).resolve().parents[1] / "recipe.toml"  # examples/recipe.toml
MODEL_FIELDS = ("input_ids", "labels", "attention_mask", "position_ids")


class TinyLlama(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.model = LlamaForCausalLM(LlamaConfig(
            vocab_size=258, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=4, max_position_embeddings=512, bos_token_id=256, eos_token_id=257,
            pad_token_id=0))

    def training_step(self, batch, batch_idx):
        loss = self.model(**{k: batch[k] for k in MODEL_FIELDS}).loss
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--save-every", type=int, default=6)
    ap.add_argument("--out", default="runs/pl")
    ap.add_argument("--resume", help="a .ckpt file of an earlier run")
    ap.add_argument("--devices", type=int, default=1, help="ranks: Lightning starts the others (or torchrun's)")
    ap.add_argument("--runner", default="distributed", help="threads or synchronous skip the Dask cluster")
    a = ap.parse_args(argv)

    pipeline = (z.Pipeline.from_config(RECIPE)
                .batch(4, labels="hf", mask_document_boundaries=True)
                .options(runner=a.runner))
    checkpoints = ModelCheckpoint(dirpath=a.out, every_n_train_steps=a.save_every, save_top_k=-1,
                                  filename="{step}")
    trainer = pl.Trainer(max_steps=a.steps, accelerator="cpu", devices=a.devices,
                         strategy="ddp" if a.devices > 1 else "auto", logger=False, callbacks=[checkpoints])
    with pipeline:
        trainer.fit(TinyLlama(), datamodule=ZephonDataModule(pipeline), ckpt_path=a.resume)


if __name__ == "__main__":
    try:
        main()
    finally:  # every rank ends its process group: gloo threads left at exit can abort the process
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
