"""Stateless record operators: map, filter, decode_text. Pure per record."""

from __future__ import annotations

from collections.abc import Callable

from ..errors import ConfigError, DataFormatError, MissingFieldError, OperatorOutputError
from ..validate import check_choice, check_name
from .base import RecordOp
from .identity import check_pins, function_identity

DECODE_ERRORS = ("strict", "replace", "ignore", "backslashreplace", "surrogateescape")


class _UserFunctionOp(RecordOp):
    """A record operator wrapping a user function; its identity enters the fingerprint."""

    def __init__(self, fn: Callable, name: str | None = None, version=None):
        if not callable(fn):
            raise ConfigError(f".{self.name}({fn!r}): expected a callable taking a record dict")
        check_pins(name, version, self.name)
        self.fn = fn
        self.identity = function_identity(fn, name, version)

    def spec(self) -> dict:
        return {"op": self.name, **self.identity}


class Map(_UserFunctionOp):
    """``record -> fn(record)``; ``fn`` must return a dict."""

    name = "map"
    one_to_one = True

    def apply(self, record: dict) -> list[dict]:
        out = self.fn(record)
        if not isinstance(out, dict):
            raise OperatorOutputError(
                f"map function {self.identity['fn']} returned {type(out).__name__}, not a dict; "
                "return the (possibly modified) record"
            )
        return [out]


class Filter(_UserFunctionOp):
    """Keeps a record when ``fn(record)`` is truthy."""

    name = "filter"

    def apply(self, record: dict) -> list[dict]:
        return [record] if self.fn(record) else []


class DecodeText(RecordOp):
    """Decodes a bytes field to ``str`` in place (``encoding``, strict errors)."""

    name = "decode_text"
    one_to_one = True

    def __init__(self, field: str = "text", encoding: str = "utf-8", errors: str = "strict"):
        check_name(field, "field", "the name of a bytes field", call="decode_text")
        try:
            "".encode(check_name(encoding, "encoding", "a Python codec name, e.g. 'utf-8'", call="decode_text"))
        except LookupError:
            raise ConfigError(f"decode_text(encoding={encoding!r}) is not a known codec") from None
        check_choice(errors, DECODE_ERRORS, "errors", call="decode_text")
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
