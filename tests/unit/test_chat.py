"""Chat / SFT data: ``tokenize_chat`` renders like ``transformers``, masks the assistant's tokens,
and the mask travels through pack, shuffle, stateful and batches (``operators/chat.py``).

Oracles: a hand-written mask; ``transformers``' ``apply_chat_template`` (its token ids, and its
``assistant_masks`` for a template with ``{% generation %}`` markers); a slow per-token reference
of the batches built from lineage.
"""

from __future__ import annotations

import json
import pickle
import random

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

import zephon_dask as z
from tests.helpers.oracles import batch_rows
from zephon_dask.core import compute_window
from zephon_dask.errors import (
    ChatFormatError,
    ConfigError,
    FieldTypeError,
    MissingFieldError,
    ZephonError,
)
from zephon_dask.operators.chat import TokenizeChat
from zephon_dask.operators.table import SampleTable

IGNORE = -100
SPECIALS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# the same rendering, with the assistant turns marked for transformers' assistant_masks
CHATML_GENERATION = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\n' }}{% generation %}{{ message['content'] + '<|im_end|>\n' }}{% endgeneration %}"
    "{% else %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# bos/eos variables, raise_exception, whitespace control: the features transformers' environment has
LLAMA2ISH = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system = false %}{% endif %}\n"
    "{% for message in loop_messages %}\n"
    "  {% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}\n"
    "  {% if loop.index0 == 0 and system %}{% set content = '<<SYS>>\\n' + system + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}\n"
    "  {% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}\n"
    "  {% elif message['role'] == 'assistant' %}{{ ' ' + content.strip() + ' ' + eos_token }}\n"
    "  {% endif %}\n"
    "{% endfor %}"
)
WORDS = ("hello there how are you I am fine thanks what is two plus three four five the answer "
         "please tell me a story once upon time café naïve 東京 ok sure").split()


def random_conversation(rng: random.Random) -> list[dict]:
    out = [{"role": "system", "content": "Be brief."}] if rng.random() < 0.4 else []
    for _ in range(rng.randint(1, 3)):
        for role in ("user", "assistant"):
            out.append({"role": role, "content": " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12)))})
    return out


@pytest.fixture(scope="module")
def bpe():
    """A small byte-level BPE tokenizer, trained here (no download)."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    rng = random.Random(0)
    corpus = [" ".join(rng.choice(WORDS) for _ in range(20)) for _ in range(200)]
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    return tok


def hf_tokenizer(tok, template):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=tok, chat_template=template, bos_token="<s>",
                                   eos_token="</s>", unk_token="<unk>")


def run_op(op, conversations, name="chat"):
    """The op's output rows for in-memory conversations (one chunk)."""
    from zephon_dask.operators.base import ChunkContext, Row

    pointers = np.array([[0, 0, i] for i in range(len(conversations))], np.int64)
    ctx = ChunkContext(0, (name,), pointers)
    return op.apply_chunk([Row(i, 0, {"messages": c}) for i, c in enumerate(conversations)], ctx)


# -- the mask, by hand ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def words():
    """A word-level tokenizer: one token per word, so a mask can be written by hand."""
    vocab = {w: i for i, w in enumerate(SPECIALS + ["system", "user", "assistant", "hi", "hello", "there",
                                                     "bye", "see", "you", "Be", "brief."])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(SPECIALS)
    return tok


CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "hello there"},
    {"role": "user", "content": "bye"},
    {"role": "assistant", "content": "see you"},
]
#                     token            assistant  last
EXPECTED = [("<|im_start|>", 0, 0), ("system", 0, 0), ("Be", 0, 0), ("brief.", 0, 0), ("<|im_end|>", 0, 0),
            ("<|im_start|>", 0, 0), ("user", 0, 0), ("hi", 0, 0), ("<|im_end|>", 0, 0),
            ("<|im_start|>", 0, 0), ("assistant", 0, 0), ("hello", 1, 0), ("there", 1, 0), ("<|im_end|>", 1, 0),
            ("<|im_start|>", 0, 0), ("user", 0, 0), ("bye", 0, 0), ("<|im_end|>", 0, 0),
            ("<|im_start|>", 0, 0), ("assistant", 0, 0), ("see", 1, 1), ("you", 1, 1), ("<|im_end|>", 1, 1)]


@pytest.mark.parametrize("loss_on,column", [("assistant", 1), ("last", 2)])
def test_mask_matches_a_hand_written_one(words, loss_on, column):
    [row] = run_op(TokenizeChat(words, chat_template=CHATML, loss_on=loss_on), [CONVERSATION])
    got = [(words.id_to_token(int(t)), int(m)) for t, m in zip(row.record["tokens"], row.record["loss_mask"],
                                                               strict=True)]
    assert got == [(e[0], e[column]) for e in EXPECTED]
    assert row.record["loss_mask"].dtype == np.uint8 and row.record["tokens"].dtype == np.int32


def test_byte_tokenizer_masks_whole_characters():
    [row] = run_op(TokenizeChat("bytes", chat_template=CHATML), [[{"role": "user", "content": "é?"},
                                                                  {"role": "assistant", "content": "東京"}]])
    tokens, mask = row.record["tokens"], row.record["loss_mask"]
    text = bytes(tokens.astype(np.uint8)).decode()
    trained = bytes(tokens[mask == 1].astype(np.uint8)).decode()
    assert trained == "東京<|im_end|>\n" and text.endswith(trained)


# -- equal to transformers ---------------------------------------------------------------------


@pytest.mark.parametrize("template", [CHATML, LLAMA2ISH])
def test_tokens_equal_transformers_apply_chat_template(bpe, tmp_path, template):
    hf = hf_tokenizer(bpe, template)
    hf.save_pretrained(tmp_path)  # tokenizer.json + tokenizer_config.json (+ the template) side by side
    rng = random.Random(1)
    conversations = [random_conversation(rng) for _ in range(40)]
    for source in (hf, str(tmp_path / "tokenizer.json"), tmp_path):
        op = TokenizeChat(source)
        assert op.template.variables["bos_token"] == "<s>" and op.template.variables["eos_token"] == "</s>"
        for conv, row in zip(conversations, run_op(op, conversations), strict=True):
            want = hf.apply_chat_template(conv, tokenize=True, return_dict=True)["input_ids"]
            assert row.record["tokens"].tolist() == list(want)
            assert op.template.render(op.messages({"messages": conv}, "")) == hf.apply_chat_template(
                conv, tokenize=False)


def test_mask_equals_transformers_assistant_masks(bpe):
    """Prefix rendering finds the spans transformers' {% generation %} markers find."""
    hf = hf_tokenizer(bpe, CHATML_GENERATION)
    rng = random.Random(2)
    conversations = [random_conversation(rng) for _ in range(40)]
    plain = run_op(TokenizeChat(bpe, chat_template=CHATML), conversations)
    marked = run_op(TokenizeChat(hf), conversations)
    for conv, a, b in zip(conversations, plain, marked, strict=True):
        want = hf.apply_chat_template(conv, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
        assert a.record["tokens"].tolist() == b.record["tokens"].tolist() == list(want["input_ids"])
        assert a.record["loss_mask"].tolist() == b.record["loss_mask"].tolist() == list(want["assistant_masks"])


# a template that renders tool calls, as most templates of tool-using models do
TOOLS = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message.content %}{{ message.content }}{% endif %}"
    "{% for call in message.tool_calls or [] %}<tool>{{ call.function.name }}</tool>{% endfor %}"
    "<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def test_tool_call_messages_with_content_none_render_as_transformers_renders_them(bpe):
    call = {"type": "function", "function": {"name": "add", "arguments": {"a": 2}}}
    conv = [{"role": "user", "content": "two plus three"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "content": "five"},
            {"role": "assistant", "content": "the answer is five"}]
    hf = hf_tokenizer(bpe, TOOLS)
    op = TokenizeChat(hf)
    [row] = run_op(op, [conv])
    assert op.template.render(op.messages({"messages": conv}, "")) == hf.apply_chat_template(conv, tokenize=False)
    assert row.record["tokens"].tolist() == list(hf.apply_chat_template(conv, tokenize=True, return_dict=True)["input_ids"])
    trained = bpe.decode(row.record["tokens"][row.record["loss_mask"] == 1].tolist(), skip_special_tokens=False)
    assert "<tool>add</tool>" in trained and "the answer is five" in trained  # the call is learnt too


def test_template_raise_exception_names_the_record(bpe):
    op = TokenizeChat(bpe, chat_template=LLAMA2ISH, bos_token="<s>", eos_token="</s>")
    bad = [{"role": "user", "content": "hi"}, {"role": "user", "content": "again"}]
    with pytest.raises(ChatFormatError, match=r"dataset 'chat', shard 0, offset 1 .*must alternate"):
        run_op(op, [CONVERSATION[1:3], bad])


def test_a_template_that_rewrites_earlier_turns_is_refused(bpe):
    sneaky = "{% for m in messages %}{{ m['role'] + ':' + m['content'] + '|' + (messages|length|string) }}{% endfor %}"
    with pytest.raises(ChatFormatError, match="not prefix-stable"):
        run_op(TokenizeChat(bpe, chat_template=sneaky), [CONVERSATION])


# -- typed errors ------------------------------------------------------------------------


def one_lane(ds):
    return z.Pipeline(z.MixtureWorkSource([ds], chunk_size=4, seed=0)).options(canonical_replicas=1)


@pytest.mark.parametrize("conversation,error,builtin,words", [
    ("hello", FieldTypeError, TypeError, "not a list"),
    ([], ChatFormatError, ValueError, "empty conversation"),
    (["hi"], FieldTypeError, TypeError, "message 0 is str"),
    ([{"content": "hi"}], MissingFieldError, ValueError, "message 0 has no 'role'"),
    ([{"role": "user", "content": "hi"}, {"role": "assistant"}], MissingFieldError, ValueError,
     "message 1 has no 'content'"),
    ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": None}], ChatFormatError, ValueError,
     "message(s) [1] have content None, which this template does not render"),
    ([{"role": "robot", "content": "hi"}], ChatFormatError, ValueError, "role 'robot'"),
    ([{"role": "user", "content": 3}], FieldTypeError, TypeError, "content 3"),
])
def test_bad_conversations_raise_typed_errors_naming_the_record(conversation, error, builtin, words):
    good = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    records = {"0": [{"messages": good}], "1": [{"messages": good}, {"messages": conversation}]}
    ds = z.Dataset.from_records("convs", records, text_field="messages")
    pipe = one_lane(ds).tokenize_chat("bytes", chat_template=CHATML)
    with pytest.raises(error) as info:
        compute_window(pipe.spec, 0, 0)
    assert isinstance(info.value, ZephonError) and isinstance(info.value, builtin)
    assert "dataset 'convs', shard 1, offset 1" in str(info.value) and words in str(info.value)


def test_missing_field_and_bad_settings():
    ds = z.Dataset.from_records("convs", [{"text": "x"}])
    with pytest.raises(MissingFieldError, match=r"'convs'.*no field 'messages'.*\['text'\].*tokenize_chat\(field="):
        one_lane(ds).tokenize_chat("bytes", chat_template=CHATML)  # at build time: the fields are known
    pipe = one_lane(ds).map(lambda r: r, version=1).tokenize_chat("bytes", chat_template=CHATML)
    with pytest.raises(MissingFieldError, match="offset 0 .*no field 'messages'"):
        compute_window(pipe.spec, 0, 0)  # after a map, at run time, naming the record
    base = one_lane(ds)
    with pytest.raises(ConfigError, match="no chat template"):
        base.tokenize_chat("bytes")
    with pytest.raises(ConfigError, match="does not compile"):
        base.tokenize_chat("bytes", chat_template="{% for m in messages %}")
    with pytest.raises(ConfigError, match="loss_on"):
        base.tokenize_chat("bytes", chat_template=CHATML, loss_on="user")
    with pytest.raises(ConfigError, match="offsets"):
        base.tokenize_chat(lambda s: [1, 2], chat_template=CHATML)
    with pytest.raises(ConfigError, match="already tokenizes"):
        base.tokenize().tokenize_chat("bytes", chat_template=CHATML)
    with pytest.raises(ConfigError, match="prepare_tokens cannot use TokenizeChat"):
        z.prepare_tokens(z.Dataset.from_records("c", [{"messages": []}], text_field="messages"),
                         TokenizeChat("bytes", chat_template=CHATML), "unused")


def test_settings_enter_the_fingerprint_and_the_op_pickles(bpe):
    ds = z.Dataset.from_records("convs", [{"messages": CONVERSATION}], text_field="messages")
    base = one_lane(ds)
    prints = {base.tokenize_chat(bpe, chat_template=t, loss_on=lo, max_length=m).spec.fingerprint
              for t in (CHATML, CHATML_GENERATION) for lo in ("assistant", "last") for m in (None, 8)}
    assert len(prints) == 8
    op = TokenizeChat(bpe, chat_template=CHATML)
    again = pickle.loads(pickle.dumps(op))
    [a], [b] = run_op(op, [CONVERSATION]), run_op(again, [CONVERSATION])
    assert a.record["tokens"].tolist() == b.record["tokens"].tolist()
    assert a.record["loss_mask"].tolist() == b.record["loss_mask"].tolist()


# -- the mask through pack, shuffle and batches -----------------------------------------------


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("chat")
    rng = random.Random(3)
    for name, files in (("sft", 2), ("dialog", 1)):
        (root / name).mkdir()
        for f in range(files):
            with open(root / name / f"part-{f}.jsonl", "w") as fh:
                for _ in range(30):
                    fh.write(json.dumps({"messages": random_conversation(rng)}) + "\n")
    return root


def chat_pipeline(chat_dir, bpe, algorithm="best_fit", labels=True, loss_on="assistant", microbatch=2,
                  **options):
    sets = [z.Dataset.from_jsonl(n, str(chat_dir / n), text_field="messages", progress=False)
            for n in ("sft", "dialog")]
    ws = z.MixtureWorkSource(sets, {"sft": 2, "dialog": 1}, chunk_size=8, seed=4)
    return (z.Pipeline(ws).tokenize_chat(hf_tokenizer(bpe, CHATML_GENERATION), loss_on=loss_on, max_length=150)
            .shuffle(8).pack(128, algorithm=algorithm, pad_id=0).batch(microbatch, labels=labels)
            .options(canonical_replicas=2, flush_every_k_chunks=2, **{"runner": "synchronous", **options}))


def reference_batch(batch, pipeline, hf):
    """Slow oracle: each row's tokens and mask rebuilt from its lineage and transformers, then the
    labels per token from their definition."""
    datasets = {d.name: d for d in pipeline.spec.source.datasets}
    b, width = batch["tokens"].shape
    tokens = np.zeros((b, width), np.int64)
    mask = np.zeros((b, width), np.int64)
    doc = np.full((b, width), -1, np.int64)
    for r in range(b):
        at = 0
        for k, (name, shard, offset, start, count) in enumerate(batch.sources(r)):
            [record] = datasets[name].read(shard, [offset])
            enc = hf.apply_chat_template(record["messages"], tokenize=True, return_dict=True,
                                         return_assistant_tokens_mask=True)
            ids, am = list(enc["input_ids"])[:150], list(enc["assistant_masks"])[:150]
            tokens[r, at:at + count] = ids[start:start + count]
            mask[r, at:at + count] = am[start:start + count]
            doc[r, at:at + count] = k
            at += count
    hf_labels = np.full((b, width), IGNORE, np.int64)
    for r in range(b):
        for t in range(1, width):
            if doc[r, t] >= 0 and doc[r, t - 1] >= 0 and mask[r, t]:
                hf_labels[r, t] = tokens[r, t]
    return tokens, hf_labels


@pytest.mark.parametrize("algorithm", ["wrap", "first_fit", "best_fit", "best_fit_wrap"])
def test_batches_carry_the_mask_through_every_pack_algorithm(chat_dir, bpe, algorithm):
    hf = hf_tokenizer(bpe, CHATML_GENERATION)
    for labels in ("hf", True):
        pipe = chat_pipeline(chat_dir, bpe, algorithm, labels=labels)
        n = 0
        with pipe:
            for batch in pipe:
                tokens, want = reference_batch(batch, pipe, hf)
                assert (batch["tokens"][batch["document_ids"] >= 0] == tokens[batch["document_ids"] >= 0]).all()
                if labels == "hf":
                    assert (batch["labels"] == want).all()
                else:  # the same targets, one column to the left
                    assert (batch["labels"][:, :-1] == want[:, 1:]).all() and (batch["labels"][:, -1] == IGNORE).all()
                assert (batch["loss_mask"] == (batch["labels"] != IGNORE)).all()
                n += 1
                if n == 6:
                    break
        assert n == 6


def test_stateful_accumulator_and_table_helpers_keep_the_mask():
    from zephon_dask.operators.stateful import from_samples, to_samples

    t = SampleTable.from_documents(np.arange(7), [0, 3, 7], np.zeros((2, 5)), np.array([1, 0, 1, 0, 0, 1, 1]))
    assert from_samples(to_samples(t)).digest() == t.digest()
    assert t.take([1, 0]).loss_mask.tolist() == [0, 0, 1, 1, 1, 0, 1]
    plain = SampleTable.from_documents(np.arange(2), [0, 2], np.zeros((1, 5)))
    assert plain.loss_mask is None and SampleTable.concat([plain, t]).loss_mask.tolist() == [1, 1, 1, 0, 1, 0, 0, 1, 1]
    assert t.digest() != SampleTable.from_documents(np.arange(7), [0, 3, 7], np.zeros((2, 5))).digest()


def test_windows_are_the_same_bytes_on_every_runner(chat_dir, bpe):
    a = chat_pipeline(chat_dir, bpe)
    b = chat_pipeline(chat_dir, bpe, runner="threads", n_workers=2)
    assert a.spec.fingerprint == b.spec.fingerprint
    want = compute_window(a.spec, 1, 1)
    assert want.table.loss_mask is not None and 0 < want.table.loss_mask.sum() < want.table.num_tokens
    with b:
        got = [(batch_rows(x), x["labels"].tolist()) for x in b]
    with a:
        assert got == [(batch_rows(x), x["labels"].tolist()) for x in a]


def test_resume_mid_run_gives_the_same_batches(chat_dir, bpe):
    def run(pipe, n=None):
        out = []
        for batch in pipe:
            out.append((batch_rows(batch), batch["labels"].tolist(), batch["loss_mask"].tolist()))
            if len(out) == n:
                break
        return out

    with chat_pipeline(chat_dir, bpe, labels="hf", loss_on="last") as pipe:
        truth = run(pipe)
    assert len(truth) > 8
    with chat_pipeline(chat_dir, bpe, labels="hf", loss_on="last") as pipe:
        head = run(pipe, 5)
        state = pipe.state_dict()
    with chat_pipeline(chat_dir, bpe, labels="hf", loss_on="last").load_state_dict(json.loads(json.dumps(state))) as pipe:
        tail = run(pipe)
    assert head + tail == truth


def test_the_chat_example_prints_the_assistant_turns(capsys):
    import runpy
    from pathlib import Path

    example = Path(__file__).resolve().parents[2] / "examples" / "chat" / "chat_masks.py"
    runpy.run_path(str(example), run_name="__main__")
    out = capsys.readouterr().out
    assert "[[Paris.<|im_end|>\n]]" in out and "[[What is" not in out and "a packed batch row" in out
