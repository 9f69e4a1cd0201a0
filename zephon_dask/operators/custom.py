"""A user's operators in a pipeline: ``Pipeline.add_op(op)`` and ``Pipeline.map_batch(fn)``. Pure.

:func:`adopt` checks a user's :class:`~.base.RecordOp` or :class:`~.base.Accumulator`
subclass instance at the door (the cheap part of the contract: a name, boolean
traits, a method that does the work, a class importable by a worker, a pickle round
trip, a JSON-native and stable ``spec()``) and wraps it as a :class:`CustomRecordOp`
or :class:`CustomAccumulator`: the same traits and work, and a ``spec()`` that adds
the class's identity (its qualified name and a hash of its methods' bytecode, or the
class attribute ``version`` when set) to the user's, so an edited operator changes the
fingerprint and a checkpoint of the old one is refused.

:class:`MapBatch` is ``map_batch(fn)``: a pure function of one lane batch's arrays,
applied by the consumer after the batch is cut.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..errors import ConfigError, OperatorOutputError
from .base import Accumulator, ChunkContext, RecordOp, Row, WindowContext
from .identity import canonical_json, check_pins, class_identity, function_identity
from .table import SampleTable

TRAITS = ("one_to_one", "makes_tokens", "needs_tokens")


def _fail(cls: type, problem: str) -> ConfigError:
    return ConfigError(f"add_op({cls.__name__}): {problem}")


def user_spec(op: Any) -> dict:
    """``op.spec()`` checked: a dict, JSON-native (it survives a JSON round trip unchanged) and the
    same on a second call; else a :class:`ConfigError` saying so."""
    cls = type(op)
    spec = op.spec()
    if not isinstance(spec, dict):
        raise _fail(cls, f"spec() returned {type(spec).__name__}; return a dict of the settings that "
                         "define the output, e.g. {'op': 'lowercase', 'field': 'text'}")
    try:
        native = json.loads(canonical_json(spec)) == spec
    except (TypeError, ValueError):
        native = False
    if not native:
        raise _fail(cls, f"spec() returned {spec!r}, which is not JSON-native; use str keys and only "
                         "dict, list, str, int, float (finite), bool and None values")
    if op.spec() != spec:
        raise _fail(cls, "spec() differs between two calls; it must describe the settings only "
                         "(no clock, counter or random value)")
    return spec


def adopt(op: Any) -> CustomRecordOp | CustomAccumulator:
    """``op`` checked (see the module docstring) and wrapped for a pipeline.

    Raises:
        ConfigError: ``op`` breaks one of the cheap checks; the message names the fix.
    """
    cls = type(op)
    if isinstance(op, (CustomRecordOp, CustomAccumulator)):
        return op
    if not isinstance(op, (RecordOp, Accumulator)):
        raise ConfigError(f"add_op({op!r}): expected an instance of a subclass of zephon_dask.operators.RecordOp "
                          "(per chunk) or Accumulator (per window); for a plain function use .map or .filter")
    name = getattr(op, "name", None)
    if not isinstance(name, str) or not name.replace("_", "a").isalnum():
        raise _fail(cls, f"name={name!r}; give the class a name attribute of letters, digits and '_', "
                         "e.g. name = 'lowercase' (its counters are '<name>.dropped', ...)")
    for trait in TRAITS:
        if not isinstance(getattr(op, trait), bool):
            raise _fail(cls, f"{trait}={getattr(op, trait)!r} must be a bool (a class attribute)")
    base = RecordOp if isinstance(op, RecordOp) else Accumulator
    methods = ("apply", "apply_chunk") if base is RecordOp else ("apply",)
    if all(getattr(cls, m) is getattr(base, m) for m in methods):
        raise _fail(cls, f"define {' or '.join(methods)} (see docs/operators.md, 'Writing an operator')")
    if "<locals>" in cls.__qualname__:
        raise _fail(cls, f"the class is defined inside a function ({cls.__qualname__}); define it at module "
                         "level, so a Dask worker can import it")
    version = getattr(op, "version", None)
    check_pins(None, version, f"add_op({cls.__name__})")
    spec = user_spec(op)
    try:
        copy = pickle.loads(pickle.dumps(op))
    except Exception as exc:
        raise _fail(cls, f"it does not pickle ({type(exc).__name__}: {exc}); a worker receives it pickled: "
                         "keep module-level classes and functions in its attributes (no lambda or "
                         "local function, no open file or lock)") from None
    if user_spec(copy) != spec:
        raise _fail(cls, "its spec() changes after a pickle round trip (as a worker receives it); build it "
                         "from the instance's settings only")
    identity = class_identity(cls, (RecordOp, Accumulator), version)
    wrapper = CustomRecordOp if base is RecordOp else CustomAccumulator
    return wrapper(op, {"op": "add_op", "name": name, **identity, "spec": spec})


class _Custom:
    """What both wrappers share: the user's operator, its traits and its fingerprint entry."""

    op: Any
    entry: dict

    def __init__(self, op: Any, entry: dict):
        self.op, self.entry = op, entry
        self.name = op.name
        self.one_to_one, self.makes_tokens, self.needs_tokens = (bool(getattr(op, t)) for t in TRAITS)

    def spec(self) -> dict:
        return self.entry

    def __repr__(self) -> str:
        return f"add_op({self.op!r})"


class CustomRecordOp(_Custom, RecordOp):
    """A user's :class:`~.base.RecordOp` in a pipeline (see :func:`adopt`)."""

    def apply_chunk(self, rows: list[Row], ctx: ChunkContext) -> list[Row]:
        return self.op.apply_chunk(rows, ctx)


class CustomAccumulator(_Custom, Accumulator):
    """A user's :class:`~.base.Accumulator` in a pipeline (see :func:`adopt`)."""

    def apply(self, table: SampleTable, ctx: WindowContext) -> SampleTable:
        out = self.op.apply(table, ctx)
        if not isinstance(out, SampleTable):
            raise OperatorOutputError(f"accumulator {self.name!r} returned {type(out).__name__}, not a "
                                      "SampleTable")
        return out


class MapBatch:
    """``map_batch(fn)``: ``arrays -> fn(arrays)`` on each lane batch's dict of numpy arrays, after
    the batch is cut; ``fn`` must return a dict of numpy arrays keeping ``tokens``."""

    name = "map_batch"

    def __init__(self, fn: Callable, name: str | None = None, version=None):
        if not callable(fn):
            raise ConfigError(f".map_batch({fn!r}): expected a callable taking a batch's dict of arrays")
        check_pins(name, version, "map_batch")
        self.fn = fn
        self.identity = function_identity(fn, name, version)

    def spec(self) -> dict:
        return {"op": "map_batch", **self.identity}

    def apply(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = self.fn(dict(arrays))
        if not isinstance(out, Mapping) or not all(isinstance(k, str) and isinstance(v, np.ndarray)
                                                   for k, v in out.items()) or "tokens" not in out:
            raise OperatorOutputError(
                f"map_batch function {self.identity['fn']} returned {type(out).__name__}; return a dict of "
                "numpy arrays that keeps 'tokens' (the batch's rows)")
        return dict(out)

    def __repr__(self) -> str:
        return f"MapBatch({self.identity['fn']})"


def apply_batch_ops(ops, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``arrays`` through each of ``ops`` (:class:`MapBatch`), in order."""
    for op in ops:
        arrays = op.apply(arrays)
    return arrays
