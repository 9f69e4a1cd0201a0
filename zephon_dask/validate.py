"""Argument validators shared by every layer. Pure.

Each returns the value (an integer as a Python ``int``) or raises a
:class:`~zephon_dask.errors.ConfigError` that names the argument and its
value and says what would be valid, e.g.
``shuffle(buffer_size=0) must be a positive integer (e.g. 1024)``.
An integer is a Python or numpy integer, never a ``bool``.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import numbers
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from .errors import ConfigError, UnknownArgumentError

_T = TypeVar("_T", bound=type)


def _label(name: str, value: object, call: str) -> str:
    return f"{call}({name}={value!r})" if call else f"{name}={value!r}"


def check_int(value: object, name: str, minimum: int = 1, *, below: int | None = None,
              optional: bool = False, hint: str = "", call: str = "") -> Any:
    """``value`` as an ``int`` in ``[minimum, below)`` (``below=None``: no upper bound), or
    ``None`` when it is ``None`` and ``optional``; else a :class:`ConfigError` naming
    ``name`` (as ``call(name=value)`` when ``call`` is given) and ending with ``(hint)``."""
    if value is None and optional:
        return None
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        number = int(value)
        if number >= minimum and (below is None or number < below):
            return number
    what = {0: "a non-negative integer", 1: "a positive integer"}.get(minimum, f"an integer >= {minimum}")
    if below is not None:
        what = f"an integer in [{minimum}, {below})"
    raise ConfigError(f"{_label(name, value, call)} must be {what}{' or None' if optional else ''}"
                      f"{f' ({hint})' if hint else ''}")


def did_you_mean(value: object, choices: Iterable) -> str:
    """``"did you mean 'x'? "`` for the string choice closest to ``value``, else ``""``. Pure.

    The one home of the "did you mean" hint: options, operator arguments, fields."""
    if not isinstance(value, str):
        return ""
    names = [c for c in choices if isinstance(c, str)]
    close = difflib.get_close_matches(value, names, n=1)
    if not close:  # a different case ('Bytes', 'TEXT') is close too
        lower = {c.lower(): c for c in names}
        close = [lower[value.lower()]] if value.lower() in lower else []
    return f"did you mean {close[0]!r}? " if close else ""


def check_choice(value: object, choices: Sequence, name: str, *, call: str = "") -> Any:
    """``value`` if it is one of ``choices`` (of the same type: ``1`` is not ``True``), else a
    :class:`ConfigError` listing them (with the closest one first, when close)."""
    if any(isinstance(value, type(c)) and value == c for c in choices):
        return value
    raise ConfigError(f"{_label(name, value, call)} is unknown; {did_you_mean(value, choices)}"
                      f"choose one of {', '.join(map(repr, choices))}")


def check_bool(value: object, name: str, *, call: str = "") -> bool:
    """``value`` if it is ``True`` or ``False`` (not merely truthy: ``"yes"``, ``1``), else a
    :class:`ConfigError`."""
    if isinstance(value, bool):
        return value
    raise ConfigError(f"{_label(name, value, call)} must be True or False (a bool), not a "
                      f"{type(value).__name__}; pass {name}=True or {name}=False")


def check_name(value: object, name: str, what: str, *, call: str = "") -> str:
    """``value`` if it is a non-empty ``str`` (a field or template name), else a
    :class:`ConfigError` saying what it names."""
    if isinstance(value, str) and value:
        return value
    raise ConfigError(f"{_label(name, value, call)} must be a non-empty str: {what}")


def check_seconds(value: object, name: str, hint: str = "e.g. 45") -> float:
    """``value`` as a float number of seconds in (0, 86400), else a :class:`ConfigError`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < float(value) < 86_400:
        raise ConfigError(f"{name}={value!r} must be a number of seconds in (0, 86400), {hint}")
    return float(value)


def check_keywords(cls: _T) -> _T:
    """Class decorator: each public method and classmethod of ``cls`` and its ``__init__``, unless
    it takes ``**kwargs``, refuses a keyword it does not take with an
    :class:`~zephon_dask.errors.UnknownArgumentError` (a ``ConfigError`` and a ``TypeError``)
    naming the closest one, before it runs. A method added to the class later is covered too."""
    for name, member in list(vars(cls).items()):
        if name.startswith("_") and name != "__init__":
            continue
        call = cls.__name__ if name == "__init__" else f"{cls.__name__}.{name}"
        if inspect.isfunction(member):
            setattr(cls, name, _keywords_checked(member, call))
        elif isinstance(member, classmethod):
            setattr(cls, name, classmethod(_keywords_checked(member.__func__, call)))
    return cls


def _keywords_checked(fn: Callable, call: str) -> Callable:
    if fn.__code__.co_flags & inspect.CO_VARKEYWORDS:  # it checks its own names
        return fn
    params = inspect.signature(fn).parameters.values()
    known = frozenset(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))

    @functools.wraps(fn)
    def checked(*args: Any, **kwargs: Any) -> Any:
        if not known.issuperset(kwargs):
            unknown = sorted(set(kwargs) - known)[0]
            names = sorted(known - {"self", "cls"})
            raise UnknownArgumentError(
                f"{call}() has no argument {unknown!r}; {did_you_mean(unknown, names)}"
                f"it takes: {', '.join(names)}")
        return fn(*args, **kwargs)

    return checked
