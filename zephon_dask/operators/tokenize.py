"""Tokenization: the built-in byte tokenizer, Hugging Face ``tokenizers``, or a callable.

``Tokenize`` is a stateless chunk operator: it encodes a whole chunk at once
(``encode_batch`` for Hugging Face tokenizers) and is pure given the
tokenizer. Hugging Face's own thread pool follows ``TOKENIZERS_PARALLELISM``
and ``RAYON_NUM_THREADS``; the runners set one thread per Dask worker so a
worker never oversubscribes its core.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence

import numpy as np

from ..errors import ConfigError, DatasetNotFoundError
from ..validate import is_int_at_least
from .identity import function_identity

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
            raise DatasetNotFoundError(
                f"tokenizer file {path!r} does not exist; pass the path of a Hugging Face "
                "tokenizer.json, a tokenizers.Tokenizer, or tokenizer='bytes'"
            )
        try:
            return cls(Tokenizer.from_file(path))
        except Exception as exc:
            raise ConfigError(f"{path!r} is not a Hugging Face tokenizer.json: {exc}") from None

    def special_id(self, which: str, given: int | str | None) -> int:
        if isinstance(given, int) and not isinstance(given, bool):
            return given
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

        self.__init__(Tokenizer.from_str(state["json"]))


class CallableTokenizer:
    """A user function ``str -> sequence of ints``. Pure if the function is."""

    def __init__(self, fn: Callable[[str], Sequence[int]], name=None, version=None):
        self.fn = fn
        self._identity = function_identity(fn, name, version)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [np.asarray(self.fn(t), dtype=np.int32) for t in texts]

    def identity(self) -> dict:
        return {"kind": "callable", **self._identity}


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


class Tokenize:
    """Encodes ``record[field]`` into ``record['tokens']`` (int32), with BOS/EOS and length policy.

    ``max_length`` caps a document's tokens (BOS/EOS included): longer ones are
    truncated, or with ``split_long=True`` cut into consecutive pieces that
    become separate documents. Truncated tokens are counted, never hidden.
    """

    kind = "stateless"
    name = "tokenize"

    def __init__(self, tokenizer="bytes", field="text", bos=False, eos=True, max_length=None,
                 split_long=False, bos_id=None, eos_id=None, name=None, version=None):
        self.tokenizer = resolve_tokenizer(tokenizer, name, version)
        if not isinstance(field, str) or not field:
            raise ConfigError(f"tokenize(field={field!r}): give the name of the text field")
        if max_length is not None and not is_int_at_least(max_length, 1):
            raise ConfigError(f"tokenize(max_length={max_length!r}) must be a positive int or None")
        if split_long and max_length is None:
            raise ConfigError("tokenize(split_long=True) needs max_length=<tokens per piece>")
        self.field, self.max_length, self.split_long = field, max_length, bool(split_long)
        self.bos_id = self._special("bos", bos, bos_id)
        self.eos_id = self._special("eos", eos, eos_id)

    def _special(self, which: str, enabled: bool, given) -> int | None:
        if not enabled:
            return None
        tok = self.tokenizer
        if isinstance(tok, HFTokenizer):
            return tok.special_id(which, given)
        if given is not None:
            return int(given)
        if isinstance(tok, ByteTokenizer):
            return tok.bos_id if which == "bos" else tok.eos_id
        raise ConfigError(f"a callable tokenizer needs {which}_id=<int> when {which}=True")

    def spec(self) -> dict:
        return {
            "op": "tokenize",
            "tokenizer": self.tokenizer.identity(),
            "field": self.field,
            "bos_id": self.bos_id,
            "eos_id": self.eos_id,
            "max_length": self.max_length,
            "split_long": self.split_long,
        }

    def encode_documents(self, texts: Sequence[str]):
        """Encode texts; returns ``(arrays, owner index per array, token start per array, truncated)``."""
        arrays, owners, starts, truncated = [], [], [], 0
        for i, ids in enumerate(self.tokenizer.encode_batch(texts)):
            parts = [ids]
            if self.bos_id is not None:
                parts.insert(0, np.array([self.bos_id], np.int32))
            if self.eos_id is not None:
                parts.append(np.array([self.eos_id], np.int32))
            doc = np.concatenate(parts) if len(parts) > 1 else ids
            m = self.max_length
            if m is None or len(doc) <= m:
                arrays.append(doc), owners.append(i), starts.append(0)
            elif self.split_long:
                for s in range(0, len(doc), m):
                    arrays.append(doc[s : s + m]), owners.append(i), starts.append(s)
            else:
                truncated += len(doc) - m
                arrays.append(doc[:m]), owners.append(i), starts.append(0)
        return arrays, owners, starts, truncated
