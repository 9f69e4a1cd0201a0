"""The checkpoint schema: the typed :class:`State`, its validation, migrations and diffs. Pure.

A saved state is a plain ``dict`` of builtins (dict, list, str, int, bool), so
JSON, ``torch.load(weights_only=True)`` and ``torch.distributed.checkpoint``
all take it::

    {"format": "zephon_dask.state", "version": 2,
     "fingerprint": "<sha256 of the data config>",
     "config": {... the pipeline's data config, seed and canonical_replicas included ...},
     "lanes": {"<lane>": {"window": w, "offset": o, "batches_delivered": b, "finished": f}},
     "pointers": {"<worker>/<active_workers>:<owned lanes>": <next lane>},
     "step": {"global_step": s, "batches_in_step": i, "batches_per_step": n, "dp_degree": d,
              "global_batches": G, "microbatch_size": m}}

Inside the package a state is a :class:`State` (with :class:`LaneProgress`
per lane and a :class:`StepProgress`): :meth:`State.from_dict` is the one
place a dict is validated (and an older version migrated), :meth:`State.to_dict`
the one place the dict is written, and every reader uses the fields.

``window``/``offset`` is where the lane's next undelivered sample sits: the
lane's ``offset``-th sample of its window ``window``. ``global_batches`` (G)
is the number of batches in one global step over all ranks, a data setting:
a resume on degree ``d`` takes ``G / d`` batches per rank (``G * m`` samples
per global step are kept when the microbatch size changes). Only lanes a rank
owns appear in its state; :func:`~zephon_dask.state.merge_states` joins ranks.

Version 1 (no ``global_batches``, ``microbatch_size``) is migrated on load by
:func:`migrate`; its microbatch size is unknown, recorded as 0.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, fields
from typing import Any, NamedTuple, TypeGuard

from ..errors import StateError

FORMAT = "zephon_dask.state"
VERSION = 2
MAX_COUNT = 2**62  # any count above this is corrupt (and would not fit an int64)


class LaneProgress(NamedTuple):
    """One lane's frontier: its next undelivered sample ``(window, offset)``; batches so far.

    Immutable like the other parts of a :class:`State`; a named tuple, not a dataclass, as
    one is made per delivered batch (a frozen dataclass takes several times longer to make).
    """

    window: int = 0
    offset: int = 0
    batches_delivered: int = 0
    finished: bool = False

    def to_dict(self) -> dict:
        return self._asdict()


@dataclass(frozen=True)
class StepProgress:
    """Where the global-step count stands: ``batches_in_step`` of ``batches_per_step`` (this
    rank's share at ``dp_degree``) into ``global_step``; G = ``global_batches`` batches of
    ``microbatch_size`` samples per global step (0: unknown, a migrated version 1)."""

    global_step: int
    batches_in_step: int
    batches_per_step: int
    dp_degree: int
    global_batches: int
    microbatch_size: int

    def to_dict(self) -> dict:
        return dict(self.__dict__)  # the fields, in order


PARTS = ("fingerprint", "config", "lanes", "pointers", "step")  # a state dict's keys after its header
STATE_KEYS = ("format", "version", *PARTS)
LANE_FIELDS = LaneProgress._fields
STEP_FIELDS = tuple(f.name for f in fields(StepProgress))
STEP_FIELDS_V1 = STEP_FIELDS[:4]  # version 1 recorded neither G nor the microbatch size


@dataclass(frozen=True)
class State:
    """A checkpoint: the data config and its fingerprint, each lane's progress (by lane id, in
    the order saved), the round-robin pointers and the step count. Immutable: derive one with
    :func:`dataclasses.replace`; its dicts are never changed in place."""

    fingerprint: str
    config: dict
    lanes: dict[int, LaneProgress]
    pointers: dict[str, int]
    step: StepProgress

    @classmethod
    def from_dict(cls, state: Any, where: str = "state") -> State:
        """``state`` (a dict from :meth:`to_dict`, any version; a :class:`State` passes through)
        validated and migrated. Raises :class:`StateError` naming the fault and ``where``."""
        if isinstance(state, State):
            return state
        version = _check_header(state, where)
        _check_lanes(state["lanes"], where)
        _check_pointers(state["pointers"], where)
        _check_step(state["step"], version, where)
        if version < VERSION:
            state = migrate(state, where)
        return cls(fingerprint=state["fingerprint"], config=_plain(state["config"]),
                   lanes={int(lane): LaneProgress(**p) for lane, p in state["lanes"].items()},
                   pointers=dict(state["pointers"]), step=StepProgress(**state["step"]))

    def to_dict(self) -> dict:
        """The state as plain builtins (a new dict sharing nothing with this state)."""
        return {"format": FORMAT, "version": VERSION, "fingerprint": self.fingerprint,
                "config": copy.deepcopy(self.config),
                "lanes": {str(lane): p.to_dict() for lane, p in self.lanes.items()},
                "pointers": dict(self.pointers), "step": self.step.to_dict()}


def pointer_key(worker: int, active_workers: int, lanes: list[int]) -> str:
    """``"<worker>/<active_workers>:<owned lanes>"``: never a rank, so DP peers share it."""
    return f"{worker}/{active_workers}:{','.join(str(lane) for lane in lanes)}"


def _is_count(value: object) -> TypeGuard[int]:
    return type(value) is int and 0 <= value <= MAX_COUNT


def is_lane_key(key: Any) -> bool:
    """A lane id as a state key: ASCII decimal digits, no sign, no leading zero."""
    return (isinstance(key, str) and key.isascii() and key.isdigit()
            and (key == "0" or not key.startswith("0")) and len(key) <= 9)


def _migrate_v1(state: dict) -> dict:
    """v1 -> v2: record G. v1 took ``batches_per_step * dp_degree`` batches per global step
    when that was a multiple of R, otherwise (uneven lanes per group) one cycle of R."""
    out = copy.deepcopy(state)
    step = out["step"]
    replicas = out["config"].get("canonical_replicas")
    g = step["batches_per_step"] * step["dp_degree"]
    if isinstance(replicas, int) and replicas > 0 and g % replicas:
        g = replicas
    step["global_batches"] = g
    step["microbatch_size"] = 0  # unknown: v1 did not record it
    out["version"] = 2
    return out


MIGRATIONS = {1: _migrate_v1}  # version v -> a function returning the state dict at v + 1


def migrate(state: dict, where: str = "state") -> dict:
    """``state`` (already structurally checked for its own version) brought to :data:`VERSION`."""
    while state["version"] < VERSION:
        step = MIGRATIONS.get(state["version"])
        if step is None:
            raise StateError(f"{where} has version {state['version']}, which this zephon_dask cannot "
                             f"migrate (it reads versions {sorted(MIGRATIONS)} and {VERSION})")
        state = step(state)
    return state


def check_state(state: Any, where: str = "state") -> dict:
    """Validate a state's structure, migrate an older version; return a plain ``dict``.

    Raises :class:`StateError` naming the fault (see :meth:`State.from_dict`).
    The result shares nothing with ``state``.
    """
    return State.from_dict(state, where).to_dict()


# -- validation of a state dict, one part at a time (State.from_dict runs them in order) --------

def _check_header(state: Any, where: str) -> int:
    """The format, the version (returned) and the presence of every part."""
    version = _check_version(state, where)
    missing = [k for k in PARTS if k not in state]
    if missing:
        raise StateError(f"{where} lacks {missing}: it is truncated or not a zephon_dask state")
    if not isinstance(state["fingerprint"], str) or not isinstance(state["config"], dict):
        raise StateError(f"{where} has a malformed fingerprint or config")
    return version


def _check_version(state: Any, where: str) -> int:
    if not isinstance(state, dict):
        raise StateError(f"{where} must be a dict from Pipeline.state_dict(), got {type(state).__name__}")
    if state.get("format") != FORMAT:
        raise StateError(f"{where} has format {state.get('format')!r}, expected {FORMAT!r}: "
                         "pass a dict from Pipeline.state_dict() or zephon_dask.load_state()")
    version = state.get("version")
    if not _is_count(version) or version < 1:
        raise StateError(f"{where} has version {version!r}; expected an int from 1 to {VERSION}")
    if version > VERSION:
        raise StateError(f"{where} has version {version}, newer than this zephon_dask understands "
                         f"({VERSION}); upgrade zephon_dask to resume from it")
    return version


def _is_lane(progress: Any) -> bool:
    return (isinstance(progress, dict) and set(progress) == set(LANE_FIELDS)
            and all(_is_count(progress[k]) for k in LANE_FIELDS[:3])
            and isinstance(progress["finished"], bool))


def _check_lanes(lanes: Any, where: str) -> None:
    if not isinstance(lanes, dict):
        raise StateError(f"{where}['lanes'] must be a dict of lane id -> progress")
    for lane, progress in lanes.items():
        if not (is_lane_key(lane) and _is_lane(progress)):
            raise StateError(f"{where}['lanes'][{lane!r}] = {progress!r} is malformed; expected a lane "
                             f"id of ASCII digits -> {{{', '.join(LANE_FIELDS)}}} with non-negative "
                             "ints and a bool")


def _check_pointers(pointers: Any, where: str) -> None:
    if not isinstance(pointers, dict) or not all(isinstance(k, str) and _is_count(v) for k, v in pointers.items()):
        raise StateError(f"{where}['pointers'] = {pointers!r} must map keys to lane ids")


def _check_step(step: Any, version: int, where: str) -> None:
    names = STEP_FIELDS if version >= 2 else STEP_FIELDS_V1
    if not isinstance(step, dict) or set(step) != set(names) or not all(_is_count(v) for v in step.values()):
        raise StateError(f"{where}['step'] = {step!r} is malformed; expected {{{', '.join(names)}}}")
    if step["batches_per_step"] < 1 or step["dp_degree"] < 1 or (version >= 2 and step["global_batches"] < 1):
        raise StateError(f"{where}['step'] = {step!r}: batches_per_step, dp_degree and global_batches "
                         "must be positive")


def _plain(obj: Any) -> Any:
    """``obj`` rebuilt from plain dicts and lists (a dict subclass becomes a ``dict``)."""
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_plain(v) for v in obj]
    return obj


def _flatten(obj: Any, path: str, out: dict[str, Any]) -> None:
    if isinstance(obj, dict):
        for key in sorted(obj):
            _flatten(obj[key], f"{path}.{key}" if path else str(key), out)
    elif isinstance(obj, list):
        out[f"{path}#len"] = len(obj)
        for i, item in enumerate(obj):
            _flatten(item, f"{path}[{i}]", out)
    else:
        out[path] = obj


_MISSING = "<absent>"


def config_diff(saved: dict, current: dict) -> list[tuple[str, Any, Any]]:
    """``(path, checkpoint value, pipeline value)`` for every leaf that differs, sorted by path."""
    a: dict[str, Any] = {}
    b: dict[str, Any] = {}
    _flatten(saved, "", a)
    _flatten(current, "", b)
    return [(k, a.get(k, _MISSING), b.get(k, _MISSING)) for k in sorted(set(a) | set(b))
            if a.get(k, _MISSING) != b.get(k, _MISSING)]


def describe_diff(diff: list[tuple[str, Any, Any]], limit: int = 20) -> str:
    lines = [f"  {path}: checkpoint {old!r}, pipeline {new!r}" for path, old, new in diff[:limit]]
    if len(diff) > limit:
        lines.append(f"  ... and {len(diff) - limit} more")
    if any(path.endswith(".code") for path, _, _ in diff):
        lines.append("  (a user function's bytecode changed; bytecode differs across Python versions: "
                     "pin version= on .map/.filter/.stateful to keep a function's identity stable)")
    return "\n".join(lines)
