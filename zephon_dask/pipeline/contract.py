"""The operator contract checked on sample data: ``Pipeline.validate()``. Reads data, changes nothing.

Each ``add_op`` record operator runs on the first chunks of lane 0's first window (as the
operators before it leave them), each ``add_op`` accumulator on lane 0's first window and
on another lane's (as the accumulators before it leave them), each ``map_batch`` function
on the first batch of lane 0. Every run is repeated and compared (:func:`same`): on the
same instance, on a pickled copy (as a worker receives it) and, for an accumulator, after
the other window. Around each run the global RNGs' states and the input are compared, and
the instance's pickle before and after (nothing kept on it). A declared trait is checked
against the output. The first broken rule raises :class:`OperatorContractError`.
"""

from __future__ import annotations

import copy
import pickle
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..consumer.cut import make_batch
from ..core.spec import PipelineSpec
from ..core.window import compute_chunk, compute_window, read_chunk
from ..errors import OperatorContractError
from ..operators.base import ChunkContext, Row, WindowContext
from ..operators.custom import CustomAccumulator, CustomRecordOp, MapBatch, user_spec
from ..operators.table import SampleTable


@dataclass(frozen=True)
class Validation:
    """What :func:`validate` checked: one line per operator (``str()`` joins them)."""

    lines: tuple[str, ...]

    def __str__(self) -> str:
        return "\n".join(self.lines) if self.lines else "no add_op operator or map_batch function to validate"


def same(a: Any, b: Any) -> bool:
    """Equal values, arrays compared by dtype, shape and elements, containers by type and items."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype
                and a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")))
    if isinstance(a, dict):
        return type(a) is type(b) and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, SampleTable):
        return isinstance(b, SampleTable) and a.digest() == b.digest()
    if isinstance(a, float) and a != a:
        return isinstance(b, float) and b != b
    return type(a) is type(b) and bool(a == b)


def _rng_states() -> dict[str, Any]:
    states: dict[str, Any] = {"random": random.getstate(), "numpy's": np.random.get_state()}
    torch = sys.modules.get("torch")  # checked only where it is loaded: an operator drawing from it loads it
    if torch is not None:
        states["torch's"] = torch.random.get_rng_state().numpy().tobytes()
    return states


class _Checker:
    """Runs one operator and raises on the first broken rule, naming it."""

    def __init__(self, label: str, target: Any):
        self.label, self.target, self.checks = label, target, 0

    def fail(self, problem: str, fix: str) -> OperatorContractError:
        return OperatorContractError(f"{self.label}: {problem}; {fix}")

    def run(self, fn: Callable[[Any], Any], given: Any, where: str) -> Any:
        """``fn`` on a copy of ``given``, checking the global RNGs, the input and the instance."""
        arg = copy.deepcopy(given)
        before, kept = _rng_states(), self._pickled()
        out = fn(arg)
        after = _rng_states()
        drawn = [name for name in before if name in after and not same(before[name], after[name])]
        if drawn:
            raise self.fail(f"it drew from the global {', '.join(drawn)} RNG on {where}",
                            "derive randomness from the record or the seed (numpy.random.default_rng("
                            "SeedSequence([seed, ...]))), never the global generators")
        if not same(arg, given):
            raise self.fail(f"it changed its input in place on {where}", "return new records / arrays instead")
        if self._pickled() != kept:
            raise self.fail(f"the instance changed while running on {where}",
                            "keep no state on the operator: a chunk or window runs anywhere, in any order")
        self.checks += 3
        return out

    def _pickled(self) -> bytes | None:
        try:
            return pickle.dumps(self.target)
        except Exception:
            return None

    def agree(self, a: Any, b: Any, what: str, fix: str) -> None:
        if not same(a, b):
            raise self.fail(f"{what} gave different outputs", fix)
        self.checks += 1

    def copy(self) -> Any:
        try:
            return pickle.loads(pickle.dumps(self.target))
        except Exception as exc:
            raise self.fail(f"it does not pickle ({type(exc).__name__}: {exc})",
                            "a worker receives it pickled: define its class at module level and keep "
                            "no lambda, local function, open file or lock in its attributes") from None


def _check_record_op(op: CustomRecordOp, spec: PipelineSpec, g: int, pointers: np.ndarray,
                     rows: list[Row], check: _Checker) -> None:
    def on(target) -> Callable[[list[Row]], tuple]:
        def run(given: list[Row]) -> tuple:
            ctx = ChunkContext(g, spec.source.names, pointers)
            return target.apply_chunk(given, ctx), ctx.stats
        return run

    where = f"chunk {g}"
    first = check.run(on(op.op), rows, where)
    check.agree(first, check.run(on(op.op), rows, where), f"two runs on {where}",
                "an operator must be a pure function of its input (no clock, counter or global state)")
    check.agree(first, check.run(on(check.copy()), rows, where), f"a pickled copy (as a worker receives it) on {where}",
                "build everything the work reads from the instance's settings, and pickle them all")
    out = first[0]
    if op.one_to_one and [r.pointer for r in out] != [r.pointer for r in rows]:
        raise check.fail(f"one_to_one=True, but it turned {len(rows)} rows into {len(out)} on {where}",
                         "set one_to_one = False (step counts are then measured) or keep every row")
    if op.makes_tokens and any(not isinstance(r.record, dict) or "tokens" not in r.record for r in out):
        raise check.fail(f"makes_tokens=True, but a record it returned on {where} has no 'tokens'",
                         "put the token ids under 'tokens', or set makes_tokens = False")
    check.checks += 2


def _window_input(spec: PipelineSpec, lane: int, window: int, before: int) -> tuple[SampleTable, WindowContext]:
    """The table accumulator ``before`` receives in (``lane``, ``window``), and a fresh context."""
    outs = [compute_chunk(spec, g) for g in spec.window_chunks(lane, window)]
    table = SampleTable.concat([co.table for co in outs])
    for op in spec.accumulators[:before]:
        table = op.apply(table, WindowContext(spec.seed, lane, window, spec.source.names))
    return table, WindowContext(spec.seed, lane, window, spec.source.names)


def _check_accumulator(op: CustomAccumulator, spec: PipelineSpec, j: int, check: _Checker) -> list[str]:
    windows = [(0, 0)]
    other = (1, 0) if spec.canonical_replicas > 1 else (0, 1)
    if (n := spec.num_windows(other[0])) is None or n > other[1]:
        windows.append(other)
    inputs = [_window_input(spec, lane, window, j) for lane, window in windows]

    def on(target, k: int) -> Callable[[SampleTable], tuple]:
        def run(table: SampleTable) -> tuple:
            ctx = copy.deepcopy(inputs[k][1])
            return target.apply(table, ctx), ctx.stats
        return run

    names = [f"lane {lane}, window {window}" for lane, window in windows]
    first = check.run(on(op.op, 0), inputs[0][0], names[0])
    if len(windows) > 1:
        check.run(on(op.op, 1), inputs[1][0], names[1])
        check.agree(first, check.run(on(op.op, 0), inputs[0][0], names[0]), f"{names[0]} before and after {names[1]}",
                    "start empty in each apply() and keep nothing across calls: a window is a pure function "
                    "of its lane and window")
    check.agree(first, check.run(on(op.op, 0), inputs[0][0], names[0]), f"two runs on {names[0]}",
                "an operator must be a pure function of its input (no clock, counter or global state)")
    check.agree(first, check.run(on(check.copy(), 0), inputs[0][0], names[0]),
                f"a pickled copy (as a worker receives it) on {names[0]}",
                "build everything the work reads from the instance's settings, and pickle them all")
    if op.one_to_one and len(first[0]) != len(inputs[0][0]):
        raise check.fail(f"one_to_one=True, but it turned {len(inputs[0][0])} samples into {len(first[0])} on "
                         f"{names[0]}", "set one_to_one = False (step counts are then measured) or keep every sample")
    check.checks += 1
    return names


def _check_batch_op(op: MapBatch, spec: PipelineSpec, opts, check: _Checker) -> None:
    table = compute_window(spec, 0, 0).table
    arrays = dict(make_batch(table.slice(0, min(len(table), opts.microbatch_size)), 0, 0, opts,
                             spec.source.names))
    for earlier in spec.batch_ops:
        if earlier is op:
            break
        arrays = earlier.apply(arrays)
    first = check.run(op.apply, arrays, "lane 0's first batch")
    check.agree(first, check.run(op.apply, arrays, "lane 0's first batch"), "two runs on lane 0's first batch",
                "a batch function must be a pure function of the batch (no clock, counter or global state)")


def validate(pipeline, chunks: int) -> Validation:
    """Check ``pipeline``'s ``add_op`` operators and ``map_batch`` functions (see the module docstring).

    Raises:
        OperatorContractError: the first broken rule, naming the operator, the rule and the fix.
    """
    spec: PipelineSpec = pipeline.spec
    lines = []
    customs = {i: op for i, op in enumerate(spec.record_ops) if isinstance(op, CustomRecordOp)}
    if customs:
        sample = spec.window_chunks(0, 0)[:chunks]
        checkers = {i: _Checker(f"add_op({type(op.op).__name__})", op.op) for i, op in customs.items()}
        for g in sample:
            pointers, records = read_chunk(spec, g)
            rows = [Row(i, 0, rec) for i, rec in enumerate(records)]
            for i, record_op in enumerate(spec.record_ops):
                if i in customs:
                    _check_record_op(customs[i], spec, g, pointers, rows, checkers[i])
                rows = record_op.apply_chunk(rows, ChunkContext(g, spec.source.names, pointers))
        for i, check in checkers.items():
            _check_spec(customs[i], check)
            lines.append(f"{customs[i].name} (record operator {check.label}): {check.checks} checks "
                         f"passed on chunks {list(sample)}")
    for j, acc in enumerate(spec.accumulators):
        if isinstance(acc, CustomAccumulator):
            check = _Checker(f"add_op({type(acc.op).__name__})", acc.op)
            names = _check_accumulator(acc, spec, j, check)
            _check_spec(acc, check)
            lines.append(f"{acc.name} (accumulator {check.label}): {check.checks} checks passed on "
                         f"{' and '.join(names)}")
    for op in spec.batch_ops:
        check = _Checker(f"map_batch({op.identity['fn']})", op.fn)
        _check_batch_op(op, spec, pipeline.description.batch, check)
        lines.append(f"map_batch {op.identity['fn']}: {check.checks} checks passed on lane 0's first batch")
    return Validation(tuple(lines))


def _check_spec(op: CustomRecordOp | CustomAccumulator, check: _Checker) -> None:
    if user_spec(op.op) != op.entry["spec"]:
        raise check.fail("its spec() changed after running", "derive spec() from the settings alone")
    check.checks += 1
