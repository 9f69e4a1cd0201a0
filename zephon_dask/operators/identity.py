"""Canonical JSON, fingerprints and the identity of user functions. Pure.

A fingerprint is the SHA-256 of canonical JSON (sorted keys, no whitespace,
ASCII, no NaN). A user function is identified by its qualified name plus,
unless the user pins ``name=``/``version=``, a hash of its bytecode,
constants and simple closure values, so that two different lambdas never
share a fingerprint (a reused Dask key would silently return the old result).
"""

from __future__ import annotations

import hashlib
import json
import types
from typing import Any

from ..errors import ConfigError

_SIMPLE = (int, float, str, bool, type(None), bytes)


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def sha256_json(obj: Any) -> str:
    return hashlib.sha256(canonical_json(obj).encode("ascii")).hexdigest()


def _code_digest(code: types.CodeType, h) -> None:
    h.update(code.co_code)
    h.update(repr(code.co_names).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _code_digest(const, h)
        else:
            h.update(repr(const).encode())


def check_pins(name: Any, version: Any, call: str) -> None:
    """``name`` a non-empty str or ``None``, ``version`` a str, an int (not a bool) or ``None``,
    else a :class:`ConfigError` naming ``call``."""
    if name is not None and not (isinstance(name, str) and name):
        raise ConfigError(f"{call}(name={name!r}) must be a non-empty str or None: a stable name for "
                          "the function in the fingerprint")
    if version is not None and (isinstance(version, bool) or not isinstance(version, str | int)):
        raise ConfigError(f"{call}(version={version!r}) must be a str, an int or None: bump it when the "
                          "function's behaviour changes")


def function_identity(fn: Any, name: str | None = None, version: str | int | None = None) -> dict:
    """JSON-native identity of a user callable for fingerprints."""
    target = getattr(fn, "__func__", fn)
    qual = f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', type(target).__qualname__)}"
    ident: dict[str, Any] = {"fn": qual, "name": name, "version": version}
    if version is None:
        code = getattr(target, "__code__", None)
        if code is None and not isinstance(target, types.FunctionType):
            code = getattr(type(target).__call__, "__code__", None)
        if code is not None:
            h = hashlib.sha256()
            _code_digest(code, h)
            for cell in getattr(target, "__closure__", None) or ():
                value = cell.cell_contents
                h.update(repr(value).encode() if isinstance(value, _SIMPLE + (tuple,)) else b"?")
            ident["code"] = h.hexdigest()[:16]
    return ident


def class_identity(cls: type, stop: tuple[type, ...], version: str | int | None = None) -> dict:
    """JSON-native identity of a user's operator class for fingerprints: its qualified name and,
    unless ``version`` pins it, a hash of the bytecode of the methods it and its bases define
    below ``stop`` (the library's base classes), so that an edited method changes the fingerprint."""
    ident: dict[str, Any] = {"class": f"{cls.__module__}.{cls.__qualname__}", "version": version}
    if version is None:
        h = hashlib.sha256()
        for klass in cls.__mro__:
            if klass in stop or klass is object:
                break
            for attr, value in sorted(vars(klass).items()):
                code = getattr(getattr(value, "__func__", value), "__code__", None)
                if code is not None:
                    h.update(f"{klass.__qualname__}.{attr}".encode())
                    _code_digest(code, h)
        ident["code"] = h.hexdigest()[:16]
    return ident
