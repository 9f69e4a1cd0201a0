"""Chat / SFT data: which tokens are trained. Run: python examples/chat/chat_masks.py

Renders the conversations of conversations.jsonl with a ChatML template, tokenizes
them (the byte tokenizer: no download) and prints each one with the trained tokens
(``loss_mask`` 1: the assistant's turns) between [[ ]]. Then packs them and shows
that a batch's labels keep exactly those targets.
"""

from pathlib import Path

import numpy as np

import zephon_dask as z
from zephon_dask import compute_window

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def show(tokens: np.ndarray, mask: np.ndarray) -> str:
    """Byte tokens as text, the trained runs between [[ ]]."""
    out, i = [], 0
    while i < len(tokens):
        j = i
        while j < len(tokens) and mask[j] == mask[i]:
            j += 1
        text = bytes(tokens[i:j].astype(np.uint8)).decode("utf-8", errors="replace")
        out.append(f"[[{text}]]" if mask[i] else text)
        i = j
    return "".join(out)


def main(loss_on: str = "assistant") -> None:
    data = z.Dataset.from_jsonl("chat", str(Path(__file__).with_name("conversations.jsonl")),
                                text_field="messages", progress=False)
    source = z.MixtureWorkSource([data], chunk_size=8, seed=0)
    pipeline = (z.Pipeline(source).tokenize_chat("bytes", chat_template=CHATML, loss_on=loss_on)
                .options(canonical_replicas=1, runner="synchronous"))
    table = compute_window(pipeline.spec, 0, 0).table
    for i in range(len(table)):
        a, b = table.offsets[i], table.offsets[i + 1]
        print(f"--- conversation {i} ({int(table.loss_mask[a:b].sum())} of {b - a} tokens trained)")
        print(show(table.tokens[a:b], table.loss_mask[a:b]))

    packed = pipeline.pack(256, algorithm="best_fit").batch(1, labels="hf", drop_last=False)
    with packed:
        batch = next(iter(packed))
    real = batch["document_ids"][0] >= 0  # padding left out
    trained = batch["labels"][0][real] != -100  # hf labels: the target at t is token t
    print(f"--- a packed batch row: {int(trained.sum())} trained targets of {int(real.sum())} tokens")
    print(show(batch["tokens"][0][real], trained))


if __name__ == "__main__":
    main()
