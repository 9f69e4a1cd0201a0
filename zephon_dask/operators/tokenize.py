"""Tokenization: the built-in byte tokenizer, Hugging Face ``tokenizers``, or a callable.

``Tokenize`` is a record operator that works on a whole chunk at once
(``apply_chunk``; ``encode_batch`` for Hugging Face tokenizers) and is pure
given the tokenizer. Hugging Face's own thread pool follows ``TOKENIZERS_PARALLELISM``
and ``RAYON_NUM_THREADS``; the runners set one thread per Dask worker so a
worker never oversubscribes its core.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence

import numpy as np

from ..data import hf
from ..errors import (
    ConfigError,
    DataFormatError,
    DatasetNotFoundError,
    FieldTypeError,
    MissingFieldError,
    ZephonError,
)
from ..validate import check_bool, check_int, check_name, did_you_mean
from .base import ChunkContext, RecordOp, Row
from .identity import check_pins, function_identity
from .table import KEPT_DTYPES

ID_LIMIT = 2**31  # ids must fit int32 when the vocabulary size is unknown
EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "[SEP]")
BOS_CANDIDATES = ("<s>", "<bos>", "<|begin_of_text|>", "[CLS]", "<|endoftext|>")


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255, BOS 256, EOS 257 (vocab 258). Needs no files. Pure."""

    vocab_size = 258
    bos_id = 256
    eos_id = 257

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8).astype(np.int32) for t in texts]

    def decode(self, ids) -> str:
        ids = np.asarray(ids)
        return bytes(ids[ids < 256].astype(np.uint8)).decode("utf-8", errors="replace")

    def identity(self) -> dict:
        return {"kind": "bytes", "version": 1}


class HFTokenizer:
    """A ``tokenizers.Tokenizer`` (from an object or a local ``tokenizer.json``). Pure."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.content_sha256 = hashlib.sha256(tokenizer.to_str().encode("utf-8")).hexdigest()
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> HFTokenizer:
        from tokenizers import Tokenizer

        path = os.fspath(path)
        if not os.path.isfile(path):
            raise missing_tokenizer(path, "tokenizer file")
        try:
            return cls(Tokenizer.from_file(path))
        except Exception as exc:
            raise ConfigError(f"{path!r} is not a Hugging Face tokenizer.json: {exc}") from None

    def special_id(self, which: str, given: str | None) -> int:
        """The id of token ``given``, or of the first of the usual ``which`` ("bos"/"eos") tokens."""
        names = (given,) if isinstance(given, str) else (
            EOS_CANDIDATES if which == "eos" else BOS_CANDIDATES
        )
        for token in names:
            tid = self.tokenizer.token_to_id(token)
            if tid is not None:
                return tid
        raise ConfigError(
            f"the tokenizer has no {which.upper()} token among {list(names)}; pass "
            f"{which}_id=<token or id>, or {which}=False"
        )

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        encs = self.tokenizer.encode_batch_fast(list(texts), add_special_tokens=False)
        return [np.asarray(e.ids, dtype=np.int32) for e in encs]

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

    def identity(self) -> dict:
        return {"kind": "huggingface", "sha256": self.content_sha256}

    def __getstate__(self):
        return {"json": self.tokenizer.to_str()}

    def __setstate__(self, state):
        from tokenizers import Tokenizer

        HFTokenizer.__init__(self, Tokenizer.from_str(state["json"]))


def checked_ids(value, limit: int = ID_LIMIT) -> np.ndarray:
    """``value`` (a tokenizer's output for one text) as a 1-D int32 array; a :class:`ConfigError`
    for anything that would need an unsafe cast: floats, bools, nested or ragged shapes, ids
    outside ``[0, limit)``. Pure."""
    try:
        arr = np.asarray(value)
    except ValueError as exc:  # ragged nesting
        raise ConfigError(f"the tokenizer returned {_short(value)}, not a flat sequence of ints ({exc})") from None
    if arr.ndim != 1:
        raise ConfigError(f"the tokenizer returned shape {arr.shape} ({_short(value)}); it must return a "
                          "flat sequence of ints for each text")
    if not arr.size:
        return np.zeros(0, np.int32)
    if arr.dtype.kind not in "iu":
        raise ConfigError(f"the tokenizer returned {arr.dtype} values ({_short(value)}); token ids must be "
                          "ints (no floats or bools: they would be cast silently)")
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi >= limit:
        bad = lo if lo < 0 else hi
        raise ConfigError(f"the tokenizer returned id {bad}, outside [0, {limit}) (the vocabulary, or int32 "
                          "when its size is unknown)")
    return arr.astype(np.int32)


def _short(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class CallableTokenizer:
    """A user function ``str -> sequence of ints``. Pure if the function is. Its output is
    checked (:func:`checked_ids`), never cast."""

    def __init__(self, fn: Callable[[str], Sequence[int]], name=None, version=None):
        check_pins(name, version, "tokenize")
        self.fn = fn
        self._identity = function_identity(fn, name, version)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [checked_ids(self.fn(t)) for t in texts]

    def identity(self) -> dict:
        return {"kind": "callable", **self._identity}


def missing_tokenizer(path: str, what: str) -> ZephonError:
    """The error for a tokenizer path that does not exist: ``'bytes'`` when it is close to it
    (``'byte'``), how to download a hub name (``'gpt2'``), else what may be passed."""
    if hint := did_you_mean(path, ["bytes"]):
        return ConfigError(f"tokenizer={path!r} is neither 'bytes' nor an existing file; {hint}"
                           "'bytes' is the built-in UTF-8 byte tokenizer")
    if hf.looks_like_hub_id(path) and not os.path.exists(path):
        return hf.not_downloaded(path, "tokenizer")
    return DatasetNotFoundError(
        f"{what} {path!r} does not exist; pass the path of a Hugging Face tokenizer.json (or, for "
        "tokenize_chat, its folder), a tokenizers.Tokenizer, or tokenizer='bytes'"
    )


def resolve_tokenizer(tokenizer, name=None, version=None):
    """Turn the user's ``tokenizer=`` argument into a tokenizer object (at build time)."""
    if isinstance(tokenizer, ByteTokenizer | HFTokenizer | CallableTokenizer):
        return tokenizer
    if isinstance(tokenizer, str) and tokenizer == "bytes":
        return ByteTokenizer()
    if isinstance(tokenizer, str | os.PathLike):
        return HFTokenizer.from_file(tokenizer)
    if type(tokenizer).__module__.startswith("tokenizers"):
        return HFTokenizer(tokenizer)
    if callable(tokenizer):
        return CallableTokenizer(tokenizer, name, version)
    raise ConfigError(
        f"tokenizer={tokenizer!r} is not supported; use 'bytes', a tokenizer.json path, a "
        "tokenizers.Tokenizer or a callable str -> list[int]"
    )


class Tokenize(RecordOp):
    """Encodes ``record[field]`` into ``record['tokens']`` (int32), with BOS/EOS and length policy.

    ``max_length`` caps a document's tokens (BOS/EOS included): longer ones are
    truncated, or with ``split_long=True`` cut into consecutive pieces that
    become separate documents. Truncated tokens are counted, never hidden.
    """

    name = "tokenize"
    one_to_one = True  # unless split_long (set per instance)
    makes_tokens = True

    def __init__(self, tokenizer="bytes", field="text", bos=False, eos=True, max_length=None,
                 split_long=False, bos_id=None, eos_id=None, name=None, version=None, keep=None,
                 dataset_fields=None):
        self.tokenizer = resolve_tokenizer(tokenizer, name, version)
        check_name(field, "field", "the name of the text field, e.g. 'text'", call="tokenize")
        # {dataset name: its text field} when the datasets' fields differ: each record reads its own
        self.dataset_fields = None if dataset_fields is None else dict(dataset_fields)
        for flag, value in (("bos", bos), ("eos", eos), ("split_long", split_long)):
            check_bool(value, flag, call="tokenize")
        max_length = check_int(max_length, "max_length", 1, optional=True, call="tokenize",
                               hint="tokens per document, BOS/EOS included; None: no cap")
        if split_long and max_length is None:
            raise ConfigError("tokenize(split_long=True) needs max_length=<tokens per piece>")
        self.field, self.max_length, self.split_long = field, max_length, bool(split_long)
        self.one_to_one = not self.split_long  # a split document becomes several rows
        self.bos_id = self._special("bos", bos, bos_id)
        self.eos_id = self._special("eos", eos, eos_id)
        self.keep = check_keep(keep, field)

    @property
    def vocab_size(self) -> int | None:
        """The tokenizer's vocabulary size, ``None`` for a callable (unknown)."""
        return getattr(self.tokenizer, "vocab_size", None)

    def check_id(self, value, name: str) -> int:
        """``value`` as a token id of this tokenizer: an int in ``[0, vocab_size)`` (int32 when the
        vocabulary is unknown), else a :class:`ConfigError` naming ``name``. Pure."""
        if self.vocab_size:
            return check_int(value, name, 0, below=self.vocab_size, hint="a token id of the vocabulary")
        return check_int(value, name, 0, below=ID_LIMIT, hint="a token id; int32 as the vocabulary is unknown")

    def _special(self, which: str, enabled: bool, given) -> int | None:
        if not enabled:
            if given is not None:
                raise ConfigError(f"tokenize({which}_id={given!r}) is unused with {which}=False; pass "
                                  f"{which}=True to add it, or drop {which}_id")
            return None
        tok = self.tokenizer
        if isinstance(tok, HFTokenizer) and (given is None or isinstance(given, str)):
            given = tok.special_id(which, given)
        elif given is None:
            if not isinstance(tok, ByteTokenizer):
                raise ConfigError(f"a callable tokenizer needs {which}_id=<int> when {which}=True")
            given = tok.bos_id if which == "bos" else tok.eos_id
        return self.check_id(given, f"{which}_id")

    def spec(self) -> dict:
        """The operator's identity in the fingerprint: tokenizer, field, special tokens, length rules."""
        return {
            "op": "tokenize",
            "tokenizer": self.tokenizer.identity(),
            "field": self.field if self.dataset_fields is None else self.dataset_fields,
            "bos_id": self.bos_id,
            "eos_id": self.eos_id,
            "max_length": self.max_length,
            "split_long": self.split_long,
            **({"keep": dict(self.keep)} if self.keep else {}),  # absent when empty: fingerprints as before
        }

    def encode_documents(self, texts: Sequence[str]):
        """Encode texts; returns ``(arrays, owner index per array, token start per array, truncated)``."""
        arrays, owners, starts, truncated = [], [], [], 0
        encoded = self.tokenizer.encode_batch(texts)
        if len(encoded) != len(texts):
            raise ConfigError(f"the tokenizer returned {len(encoded)} documents for {len(texts)} texts")
        for i, ids in enumerate(encoded):
            parts = [ids]
            if self.bos_id is not None:
                parts.insert(0, np.array([self.bos_id], np.int32))
            if self.eos_id is not None:
                parts.append(np.array([self.eos_id], np.int32))
            doc = np.concatenate(parts) if len(parts) > 1 else ids
            m = self.max_length
            if m is None or len(doc) <= m:
                pieces = [(doc, 0)]
            elif self.split_long:
                pieces = [(doc[s : s + m], s) for s in range(0, len(doc), m)]
            else:
                truncated += len(doc) - m
                pieces = [(doc[:m], 0)]
            for piece, start in pieces:
                arrays.append(piece)
                owners.append(i)
                starts.append(start)
        return arrays, owners, starts, truncated

    def apply_chunk(self, rows: list[Row], ctx: ChunkContext) -> list[Row]:
        """Encode the rows' text field in one batch (pure given the tokenizer); a split document's
        pieces keep its pointer, their token start shifted. Counts ``tokenize.truncated_tokens``.

        A record without the field, with a value that is not a ``str``, with text that is not
        valid Unicode, or on which the tokenizer fails, is named exactly (dataset, shard, offset)
        in a typed error whose message survives pickling.
        """
        texts = [self._text(row, ctx) for row in rows]
        try:
            arrays, owners, starts, truncated = self.encode_documents(texts)
        except Exception:
            self._raise_for_culprit(rows, texts, ctx)
            raise
        if truncated:
            ctx.count("tokenize.truncated_tokens", truncated)
        return [
            Row(rows[i].pointer, rows[i].token_start + start, {**rows[i].record, "tokens": arr})
            for arr, i, start in zip(arrays, owners, starts, strict=True)
        ]

    def field_of(self, row: Row, ctx: ChunkContext) -> str:
        """The field ``row`` is read from: its dataset's text field, or ``field`` for all. Pure."""
        if self.dataset_fields is None:
            return self.field
        return self.dataset_fields[ctx.dataset_names[int(ctx.pointers[row.pointer][0])]]

    def _text(self, row: Row, ctx: ChunkContext) -> str:
        record, field = row.record, self.field_of(row, ctx)
        if field not in record:
            raise MissingFieldError(
                f"record at {ctx.where(row.pointer)} has no field {field!r} (fields: {sorted(record)}); "
                "pass tokenize(field=...)"
            )
        text = record[field]
        if not isinstance(text, str):
            raise FieldTypeError(
                f"record at {ctx.where(row.pointer)}: field {field!r} is {type(text).__name__} "
                f"{_short(text, 40)}, not a string; fix the data, or turn it into text with .map(...) "
                "(or .decode_text() for bytes) before .tokenize()"
            )
        return text

    def _raise_for_culprit(self, rows: list[Row], texts: list[str], ctx: ChunkContext) -> None:
        """After a batch encode failed: encode text by text and raise for the first one that fails,
        naming its record (returns if none fails alone; the caller re-raises the batch's error)."""
        for row, text in zip(rows, texts, strict=True):
            try:
                self.encode_documents([text])
            except UnicodeError as exc:
                raise DataFormatError(
                    f"record at {ctx.where(row.pointer)}: field {self.field_of(row, ctx)!r} is not valid Unicode ({exc}); "
                    "clean the text, e.g. .map(lambda r: {**r, 'text': r['text'].encode('utf-8', "
                    "'replace').decode()})"
                ) from None
            except Exception as exc:
                if isinstance(exc, ZephonError):
                    raise type(exc)(f"record at {ctx.where(row.pointer)}: {exc}") from None
                exc.add_note(f"zephon_dask: tokenize failed on the record at {ctx.where(row.pointer)}")
                raise


def check_keep(keep, text_field: str) -> dict[str, str | None]:
    """``tokenize(keep=)`` as ``{name: dtype or None}`` (``None``: from the values, see
    :func:`kept_fields`); a list of names or a mapping name -> one of :data:`KEPT_DTYPES`."""
    if keep is None:
        return {}
    if isinstance(keep, str):
        raise ConfigError(f"tokenize(keep={keep!r}) must be a list of field names, e.g. keep=[{keep!r}]")
    items = list(keep.items()) if isinstance(keep, dict) else [(k, None) for k in keep]
    out: dict[str, str | None] = {}
    for name, dtype in items:
        check_name(name, "keep", "a numeric record field to carry into the batch, e.g. 'domain'", call="tokenize")
        if name == text_field:
            raise ConfigError(f"tokenize(keep=[{name!r}]) names the text field; keep numeric fields only")
        if dtype is not None and dtype not in KEPT_DTYPES:
            raise ConfigError(f"tokenize(keep={{{name!r}: {dtype!r}}}): the type must be one of "
                              f"{list(KEPT_DTYPES)} (or None: from the values)")
        if name in out:
            raise ConfigError(f"tokenize(keep=...) names {name!r} twice")
        out[name] = dtype
    return out


def _kind(value) -> str | None:
    """The kept dtype a value gives by itself: bool, int64 or float32 (``None``: not numeric)."""
    if isinstance(value, bool | np.bool_):
        return "bool"
    if isinstance(value, int | np.integer):
        return "int64"
    if isinstance(value, float | np.floating):
        return "float32"
    return None


def kept_fields(keep: dict[str, str | None], records: list[dict], ctx: ChunkContext,
                pointers: list[int]) -> dict[str, np.ndarray] | None:
    """One array per kept field, one value per record (``None`` when nothing is kept). A field
    given without a type takes it from its values: bools ``bool``, ints ``int64``, floats
    ``float32`` (ints and floats mixed: an error asking for the type). A missing field or a value
    that is not a number: an error naming the record."""
    if not keep:
        return None
    out = {}
    for name, dtype in keep.items():
        values: list = []
        for record, pointer in zip(records, pointers, strict=True):
            if name not in record:
                raise MissingFieldError(
                    f"record at {ctx.where(pointer)} has no field {name!r} (fields: {sorted(record)}), "
                    f"kept by tokenize(keep=...); give every record one, e.g. with .map(...)")
            value, kind = record[name], _kind(record[name])
            if kind is None or dtype is not None and (
                    kind == "bool") != (dtype == "bool") or dtype == "int64" and kind == "float32":
                want = dtype or "a bool, int or float"
                raise FieldTypeError(
                    f"record at {ctx.where(pointer)}: kept field {name!r} is {type(value).__name__} "
                    f"{_short(value, 40)}, not {want}; fix the data or convert it with .map(...)")
            if dtype is None and values and kind != _kind(values[0]):
                raise FieldTypeError(
                    f"record at {ctx.where(pointer)}: kept field {name!r} is {kind} here and "
                    f"{_kind(values[0])} before; give its type, tokenize(keep={{{name!r}: 'float32'}})")
            values.append(value)
        target = dtype or (_kind(values[0]) if values else "int64")
        out[name] = np.asarray(values, dtype=target).reshape(len(values))
    return out
