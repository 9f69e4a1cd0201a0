"""Stateless record operators: map, filter, decode_text. Pure per record."""

from __future__ import annotations

from collections.abc import Callable

from ..errors import ConfigError, DataFormatError, MissingFieldError
from .base import RecordOp
from .identity import function_identity


def _check_callable(fn: object, op: str) -> Callable:
    if not callable(fn):
        raise ConfigError(f".{op}({fn!r}): expected a callable taking a record dict")
    return fn  # type: ignore[return-value]


class Map(RecordOp):
    """``record -> fn(record)``; ``fn`` must return a dict."""

    name = "map"

    def __init__(self, fn: Callable[[dict], dict], name: str | None = None, version=None):
        self.fn = _check_callable(fn, "map")
        self.identity = function_identity(fn, name, version)

    def spec(self) -> dict:
        return {"op": "map", **self.identity}

    def apply(self, record: dict) -> list[dict]:
        out = self.fn(record)
        if not isinstance(out, dict):
            raise TypeError(
                f"map function {self.identity['fn']} returned {type(out).__name__}, not a dict; "
                "return the (possibly modified) record"
            )
        return [out]


class Filter(RecordOp):
    """Keeps a record when ``fn(record)`` is truthy."""

    name = "filter"

    def __init__(self, fn: Callable[[dict], bool], name: str | None = None, version=None):
        self.fn = _check_callable(fn, "filter")
        self.identity = function_identity(fn, name, version)

    def spec(self) -> dict:
        return {"op": "filter", **self.identity}

    def apply(self, record: dict) -> list[dict]:
        return [record] if self.fn(record) else []


class DecodeText(RecordOp):
    """Decodes a bytes field to ``str`` in place (``encoding``, strict errors)."""

    name = "decode_text"

    def __init__(self, field: str = "text", encoding: str = "utf-8", errors: str = "strict"):
        if not isinstance(field, str) or not field:
            raise ConfigError(f"decode_text(field={field!r}): give the name of a bytes field")
        try:
            "".encode(encoding)
        except LookupError:
            raise ConfigError(f"decode_text(encoding={encoding!r}) is not a known codec") from None
        self.field, self.encoding, self.errors = field, encoding, errors

    def spec(self) -> dict:
        return {"op": "decode_text", "field": self.field, "encoding": self.encoding, "errors": self.errors}

    def apply(self, record: dict) -> list[dict]:
        if self.field not in record:
            raise MissingFieldError(
                f"record has no field {self.field!r} (fields: {sorted(record)}); "
                "pass decode_text(field=...)"
            )
        value = record[self.field]
        if isinstance(value, str):
            return [record]
        try:
            text = bytes(value).decode(self.encoding, self.errors)
        except (UnicodeDecodeError, TypeError) as exc:
            raise DataFormatError(
                f"field {self.field!r} cannot be decoded as {self.encoding}: {exc}; "
                "pass decode_text(errors='replace') to keep such records"
            ) from None
        return [{**record, self.field: text}]
