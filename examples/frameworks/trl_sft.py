"""Fine-tune a tiny Llama on chat data with TRL's SFTTrainer fed by zephon_dask pipelines.

    python examples/frameworks/trl_sft.py --steps 8 --out runs/sft
    python examples/frameworks/trl_sft.py --steps 16 --out runs/sft --resume runs/sft/checkpoint-8
    torchrun --nproc-per-node 2 examples/frameworks/trl_sft.py --steps 8 --out runs/sft-ddp

The conversations are rendered with a ChatML template and tokenized by the
pipeline (tokenize_chat: labels on the assistant's turns only), packed into
rows of 256 tokens whose position_ids restart at each conversation. TRL's own
dataset preparation never sees them: ZephonTrainerMixin feeds the trainer.
A real run loads its tokenizer with AutoTokenizer.from_pretrained(...); this
one trains a small BPE on the conversations, so nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from trl import SFTConfig, SFTTrainer

import zephon_dask as z
from zephon_dask.integrations.hf import ZephonTrainerMixin

CONVERSATIONS = Path(__file__).resolve().parents[1] / "chat" / "conversations.jsonl"
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL = ["<pad>", "<unk>", "<|im_start|>", "<|im_end|>"]


class ZephonSFTTrainer(ZephonTrainerMixin, SFTTrainer):
    """TRL's SFTTrainer, trained and evaluated on zephon_dask pipelines."""


def chat_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on the conversations' text, with the ChatML template."""
    texts = [m["content"] for line in CONVERSATIONS.open() for m in json.loads(line)["messages"]]
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=384, special_tokens=SPECIAL,
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=bpe, chat_template=CHATML, pad_token="<pad>",
                                   unk_token="<unk>", eos_token="<|im_end|>")


def chat_pipeline(tokenizer, passes: int, runner: str) -> z.Pipeline:
    """The conversations, ``passes`` times over, as packed rows with Hugging Face labels (every row:
    evaluation wants each lane's last, partial batch too)."""
    chat = z.Dataset.from_jsonl("chat", str(CONVERSATIONS), text_field="messages", progress=False)
    source = z.MixtureWorkSource([chat], chunk_size=2, seed=0, stop_after_passes=passes)
    return (z.Pipeline(source).tokenize_chat(tokenizer, loss_on="assistant").shuffle(8)
            .pack(256, algorithm="best_fit").batch(2, labels="hf", drop_last=False)
            .options(canonical_replicas=2, runner=runner))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--save-every", type=int, default=4)
    ap.add_argument("--out", default="runs/sft")
    ap.add_argument("--resume", help="a checkpoint-N folder of an earlier run")
    ap.add_argument("--runner", default="distributed", help="threads or synchronous skip the Dask cluster")
    a = ap.parse_args(argv)

    tokenizer = chat_tokenizer()
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None))
    args = SFTConfig(output_dir=a.out, max_steps=a.steps, save_steps=a.save_every, eval_strategy="steps",
                     eval_steps=a.save_every, logging_steps=a.save_every, learning_rate=1e-3, report_to=[],
                     bf16=False, gradient_checkpointing=False)
    train = chat_pipeline(tokenizer, passes=500, runner=a.runner)
    held_out = chat_pipeline(tokenizer, passes=1, runner="threads")  # finite; in a real run: held-out chats
    with train, held_out:
        trainer = ZephonSFTTrainer(model=model, args=args, train_dataset=train, eval_dataset=held_out,
                                   processing_class=tokenizer)
        trainer.train(resume_from_checkpoint=a.resume)


if __name__ == "__main__":
    try:
        main()
    finally:  # every rank ends its process group: gloo threads left at exit can abort the process
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
