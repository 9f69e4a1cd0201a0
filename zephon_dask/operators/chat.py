"""Chat / SFT data: conversations rendered with a chat template, tokenized, with a loss mask.

``TokenizeChat`` is a record operator (``Pipeline.tokenize_chat``). For each
record it renders ``record[field]`` (a list of ``{"role", "content"}`` dicts)
with the tokenizer's chat template the way ``transformers``'
``apply_chat_template`` renders it (a sandboxed jinja2 environment with
``trim_blocks`` and ``lstrip_blocks``, ``raise_exception``, ``tojson``,
``namespace``, the special tokens as variables, ``add_generation_prompt=False``),
tokenizes the text with offsets (no special tokens added: the template writes
them) and adds ``record["loss_mask"]``: 1 on the tokens of the assistant turns
(``loss_on="assistant"``) or of the last one only (``loss_on="last"``).

How the assistant spans are found: by rendering prefixes of the conversation.
For assistant message ``i``, the turn's text is

    render(messages[:i + 1])[len(render(messages[:i], add_generation_prompt=True)):]

i.e. everything the turn adds after the assistant header that a generation
prompt would print: its content and its end-of-turn marker (``<|im_end|>``,
``<|eot_id|>``, the EOS ...), which the model must learn to emit. Both
renderings are checked to be prefixes of the whole rendering; a template that
rewrites earlier turns depending on later ones (not prefix-stable) is refused
with an error naming the record, never silently mis-masked. This works for any
template without changing it (``{% generation %}`` markers, which most
templates lack, are accepted and rendered transparently). A token is marked
when its character range (from the tokenizer's offsets) overlaps a span, the
rule ``transformers`` uses for ``return_assistant_tokens_mask``, so a token
straddling a span boundary counts as trained.

``strftime_now`` is deliberately not defined: a template calling it would make
the data depend on the clock (templates test ``strftime_now is defined`` and
fall back to a fixed date).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import (
    ChatFormatError,
    ConfigError,
    FieldTypeError,
    MissingDependencyError,
    MissingFieldError,
    ZephonError,
)
from ..validate import check_choice, check_int, check_name
from .base import ChunkContext, Row
from .tokenize import ByteTokenizer, HFTokenizer, Tokenize, missing_tokenizer, resolve_tokenizer

ROLES = ("system", "user", "assistant", "tool")
LOSS_ON = ("assistant", "last")
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")  # aliased as transformers does
SPAN_METHOD = "prefix-render-v1"  # enters the fingerprint: a new method is new data


def _short_text(value, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _compile(source: str):
    """The template compiled in an environment like ``transformers``' (no clock)."""
    try:
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise MissingDependencyError("tokenize_chat needs jinja2>=3.1.6: pip install 'zephon_dask[chat]'") from None

    class GenerationBlock(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}`` rendered as its body (spans come from prefixes)."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    class Namespace(jinja2.utils.Namespace):
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                Namespace.check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            Namespace.check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"a namespace attribute may not start with '_': {name!r}")

    class TemplateDict:
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = Namespace
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise ConfigError(f"the chat template does not compile: {exc} (line {exc.lineno})") from None


class ChatTemplate:
    """A chat template and the special-token variables it sees. Pure; pickles as its text."""

    def __init__(self, source: str, variables: dict[str, str]):
        if not isinstance(source, str) or not source.strip():
            raise ConfigError(f"chat_template={_short_text(source)} must be the template's text (a jinja2 string)")
        self.source, self.variables = source, dict(sorted(variables.items()))
        self.compiled = _compile(source)

    def render(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        return self.compiled.render(messages=messages, tools=None, documents=None,
                                    add_generation_prompt=add_generation_prompt, **self.variables)

    def identity(self) -> dict:
        return {"sha256": hashlib.sha256(self.source.encode("utf-8")).hexdigest(), "variables": self.variables}

    def __getstate__(self):
        return {"source": self.source, "variables": self.variables}

    def __setstate__(self, state):
        self.source, self.variables = state["source"], state["variables"]
        self.compiled = _compile(self.source)  # a compiled template does not pickle


def _token_text(value) -> str | None:
    """A special token from ``tokenizer_config.json``: a string or an ``AddedToken`` dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read_config(tokenizer_json: str) -> tuple[str | None, dict[str, str]]:
    """``(chat template, special tokens)`` from the files beside a ``tokenizer.json``."""
    folder = os.path.dirname(os.path.abspath(tokenizer_json))
    template, variables = None, {}
    config_path = os.path.join(folder, "tokenizer_config.json")
    if os.path.isfile(config_path):
        try:
            with open(config_path, encoding="utf-8") as f:
                config = json.load(f)
        except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
            raise ConfigError(
                f"{config_path!r} is not valid JSON ({exc}); tokenize_chat reads the chat template and "
                "the special tokens from it: fix the file (or copy it again from the model), or pass "
                "chat_template= and bos_token=/eos_token= yourself"
            ) from None
        if not isinstance(config, dict):
            raise ConfigError(f"{config_path!r} holds a JSON {type(config).__name__}, not an object; "
                              "a tokenizer_config.json is an object with chat_template and the special tokens")
        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: the "default" one
            template = next((t.get("template") for t in template
                             if isinstance(t, dict) and t.get("name") == "default"), None)
        for key in SPECIAL_TOKENS:
            if (text := _token_text(config.get(key))) is not None:
                variables[key] = text
    jinja_path = os.path.join(folder, "chat_template.jinja")
    if template is None and os.path.isfile(jinja_path):
        with open(jinja_path, encoding="utf-8") as f:
            template = f.read()
    return template, variables


def resolve_chat(tokenizer, chat_template) -> tuple[Any, str | None, dict[str, str]]:
    """``(tokenizer object, template text or None, special-token variables)`` for ``tokenize_chat``."""
    template, variables = None, {}
    if hasattr(tokenizer, "backend_tokenizer") and hasattr(tokenizer, "special_tokens_map"):
        # a transformers fast tokenizer: its backend, template and special tokens
        template = getattr(tokenizer, "chat_template", None)
        variables = {k: v for k, v in tokenizer.special_tokens_map.items() if isinstance(v, str)}
        tokenizer = tokenizer.backend_tokenizer
    elif isinstance(tokenizer, str | os.PathLike) and not (isinstance(tokenizer, str) and tokenizer == "bytes"):
        path = os.fspath(tokenizer)
        if os.path.isdir(path):
            path = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(path):
            raise missing_tokenizer(os.fspath(tokenizer), "tokenizer (a tokenizer.json or a folder holding one)")
        template, variables = _read_config(path)
        tokenizer = path
    if isinstance(chat_template, os.PathLike):
        with open(chat_template, encoding="utf-8") as f:
            chat_template = f.read()
    if chat_template is not None:
        template = chat_template
    return resolve_tokenizer(tokenizer), template, variables


class TokenizeChat(Tokenize):
    """Renders, tokenizes and masks conversations (see the module docstring).

    Output records carry ``tokens`` (int32) and ``loss_mask`` (uint8, one per token).
    """

    name = "tokenize_chat"

    def __init__(self, tokenizer, field="messages", chat_template=None, loss_on="assistant",
                 max_length=None, bos_token=None, eos_token=None, roles=ROLES):
        tok, template, variables = resolve_chat(tokenizer, chat_template)
        if not isinstance(tok, HFTokenizer | ByteTokenizer):
            raise ConfigError(
                "tokenize_chat needs token offsets to find the assistant's tokens: pass a tokenizer.json "
                "path (or its folder), a tokenizers.Tokenizer, a transformers fast tokenizer or 'bytes'"
            )
        if template is None:
            raise ConfigError(
                "tokenize_chat found no chat template: pass chat_template='...' (jinja2 text), or a "
                "tokenizer.json whose folder holds a tokenizer_config.json with a chat_template"
            )
        check_name(field, "field", "the name of the messages field, e.g. 'messages'", call="tokenize_chat")
        for key, value in (("bos_token", bos_token), ("eos_token", eos_token)):
            if value is not None:
                if not isinstance(value, str):
                    raise ConfigError(f"tokenize_chat({key}={value!r}) must be the token's text, e.g. '</s>'")
                variables[key] = value
        roles = tuple(roles) if isinstance(roles, list | tuple) else roles
        if not isinstance(roles, tuple) or not roles or not all(isinstance(r, str) and r for r in roles):
            raise ConfigError(f"tokenize_chat(roles={roles!r}) must be a non-empty list of role names")
        if "assistant" not in roles:
            raise ConfigError(f"tokenize_chat(roles={list(roles)!r}) must include 'assistant'")
        self.tokenizer = tok
        self.template = ChatTemplate(template, variables)
        self.field, self.roles = field, roles
        self.loss_on = check_choice(loss_on, LOSS_ON, "loss_on", call="tokenize_chat")
        self.max_length = check_int(max_length, "max_length", 1, optional=True, call="tokenize_chat",
                                    hint="tokens per conversation; None: no cap")
        self.split_long, self.bos_id, self.eos_id = False, None, None  # the template writes the specials

    def spec(self) -> dict:
        return {
            "op": self.name,
            "tokenizer": self.tokenizer.identity(),
            "field": self.field,
            "chat_template": self.template.identity(),
            "loss_on": self.loss_on,
            "roles": list(self.roles),
            "max_length": self.max_length,
            "spans": SPAN_METHOD,
        }

    def check_first_window(self, stats: dict[str, int], samples: int, where: str) -> None:
        """Raise :class:`ChatFormatError` when a stream's first window (``where``) holds samples
        but not one trained token: every ``loss_mask`` is zero, so training would learn nothing."""
        if samples and stats.get("tokenize_chat.trained_tokens", 0) == 0:
            truncated = stats.get("tokenize_chat.truncated_tokens", 0)
            cut = (f"; max_length={self.max_length} cut {truncated:,} tokens, perhaps every assistant turn"
                   if truncated else "")
            raise ChatFormatError(
                f"tokenize_chat: the first window ({where}) holds {samples:,} samples (of "
                f"{stats.get('records', 0):,} records read) and not one trained token (loss_mask is all "
                f"zero{cut}). The chat template (sha256 {self.template.identity()['sha256'][:12]}, "
                f"{_short_text(self.template.source, 60)}) renders no assistant turn the loss can be put "
                f"on, or the conversations have no assistant message (loss_on={self.loss_on!r}). "
                "Check a record with pipeline.preview(); use a template that "
                "renders the assistant's messages"
            )

    # -- per conversation --------------------------------------------------------------

    def messages(self, record: dict, where: str) -> list[dict]:
        """The record's conversation, checked, as the template sees it (None-valued keys dropped,
        reasoning fields aliased, as ``transformers`` does). ``content: None`` (a tool-call
        message) is accepted as ``transformers`` accepts it: the template sees no content and
        renders the message its way (or refuses it: a ChatFormatError naming the message)."""
        if self.field not in record:
            raise MissingFieldError(f"record at {where} has no field {self.field!r} (fields: {sorted(record)}); "
                                    "pass tokenize_chat(field=...)")
        chat = record[self.field]
        if not isinstance(chat, list | tuple):
            raise FieldTypeError(f"record at {where}: field {self.field!r} is {type(chat).__name__} "
                                 f"{_short_text(chat)}, not a list of {{'role', 'content'}} messages")
        if not chat:
            raise ChatFormatError(f"record at {where}: field {self.field!r} is an empty conversation; "
                                  "drop such records with .filter(...) first")
        out = []
        for i, message in enumerate(chat):
            if not isinstance(message, dict):
                raise FieldTypeError(f"record at {where}: message {i} is {type(message).__name__} "
                                     f"{_short_text(message)}, not a {{'role', 'content'}} dict")
            for key in ("role", "content"):
                if key not in message:
                    raise MissingFieldError(f"record at {where}: message {i} has no {key!r} "
                                            f"(keys: {sorted(message)})")
            if message["role"] is None:
                raise FieldTypeError(f"record at {where}: message {i} has role None; give every message a role")
            message = {k: v for k, v in message.items() if v is not None}
            role, content = message["role"], message.get("content")
            if role not in self.roles:
                raise ChatFormatError(f"record at {where}: message {i} has role {_short_text(role)}, not one of "
                                      f"{list(self.roles)}; map it first, or pass tokenize_chat(roles=...)")
            if content is not None and not isinstance(content, str):
                raise FieldTypeError(f"record at {where}: message {i} has content {_short_text(content)} "
                                     f"({type(content).__name__}), not a string")
            reasoning = next((message[k] for k in REASONING_FIELDS if message.get(k) is not None), None)
            if reasoning is not None:
                message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
            out.append(message)
        return out

    def render(self, messages: list[dict], where: str) -> tuple[str, list[tuple[int, int]]]:
        """``(text, character spans of the trained turns)`` (see the module docstring)."""
        import jinja2

        assistant = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        if self.loss_on == "last":
            assistant = assistant[-1:]
        try:
            text = self.template.render(messages)
            spans = []
            for i in assistant:
                head = self.template.render(messages[:i], add_generation_prompt=True)
                upto = self.template.render(messages[: i + 1])
                if not (upto.startswith(head) and text.startswith(upto)):
                    raise ChatFormatError(
                        f"record at {where}: the chat template is not prefix-stable for message {i} (rendering "
                        "the conversation up to it is not a prefix of the whole rendering: the template "
                        "rewrites earlier turns), so the assistant's tokens cannot be located"
                    )
                spans.append((len(head), len(upto)))
        except jinja2.exceptions.TemplateError as exc:
            empty = [i for i, m in enumerate(messages) if "content" not in m]
            hint = (f" (message(s) {empty} have content None, which this template does not render, as "
                    "transformers' apply_chat_template would not either: give them content '' or use a "
                    "template that renders tool calls)") if empty else ""
            raise ChatFormatError(f"record at {where}: the chat template refused the conversation: {exc}{hint}") from None
        return text, spans

    def encode(self, texts: Sequence[str], spans: Sequence[list[tuple[int, int]]]):
        """``(token arrays, mask arrays)``: tokens of each text, 1 where a token overlaps a span."""
        if isinstance(self.tokenizer, HFTokenizer):
            encs = self.tokenizer.tokenizer.encode_batch(list(texts), add_special_tokens=False)
            ids = [np.asarray(e.ids, dtype=np.int32) for e in encs]
            offsets = [np.asarray(e.offsets, dtype=np.int64).reshape(-1, 2) for e in encs]
        else:
            ids = self.tokenizer.encode_batch(texts)
            offsets = []
            for text in texts:  # byte j belongs to character starts[j]
                starts = np.repeat(np.arange(len(text)), [len(c.encode("utf-8")) for c in text])
                offsets.append(np.stack([starts, starts + 1], axis=1))
        masks = []
        for off, ranges in zip(offsets, spans, strict=True):
            mask = np.zeros(len(off), dtype=np.uint8)
            for a, b in ranges:
                mask[(off[:, 0] < b) & (off[:, 1] > a)] = 1
            masks.append(mask)
        return ids, masks

    def encode_documents(self, texts: Sequence[str]):  # pragma: no cover - prepare_tokens refuses chat
        raise ConfigError("tokenize_chat works on conversations, not texts; prepare_tokens cannot use it")

    def apply_chunk(self, rows: list[Row], ctx: ChunkContext) -> list[Row]:
        """Render, tokenize and mask each row's conversation; counts ``tokenize_chat.trained_tokens``
        and ``tokenize_chat.truncated_tokens``. A bad conversation raises a typed error naming
        its record (dataset, shard, offset)."""
        texts, spans = [], []
        for row in rows:
            text, ranges = self.render(self.messages(row.record, ctx.where(row.pointer)), ctx.where(row.pointer))
            texts.append(text)
            spans.append(ranges)
        try:
            ids, masks = self.encode(texts, spans)
        except Exception:
            for row, text, ranges in zip(rows, texts, spans, strict=True):
                try:
                    self.encode([text], [ranges])
                except Exception as exc:
                    if isinstance(exc, ZephonError):
                        raise type(exc)(f"record at {ctx.where(row.pointer)}: {exc}") from None
                    exc.add_note(f"zephon_dask: tokenize_chat failed on the record at {ctx.where(row.pointer)}")
                    raise
            raise
        out, truncated, trained = [], 0, 0
        for row, tokens, mask in zip(rows, ids, masks, strict=True):
            if self.max_length is not None and len(tokens) > self.max_length:
                truncated += len(tokens) - self.max_length
                tokens, mask = tokens[: self.max_length], mask[: self.max_length]
            trained += int(mask.sum())
            out.append(Row(row.pointer, row.token_start, {**row.record, "tokens": tokens, "loss_mask": mask}))
        if truncated:
            ctx.count("tokenize_chat.truncated_tokens", truncated)
        ctx.count("tokenize_chat.trained_tokens", trained)
        return out
