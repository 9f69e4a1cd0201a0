"""The checkpoint schema: building, validating and comparing state dicts. Pure.

A state is JSON-native::

    {"format": "zephon_dask.state", "version": 1,
     "fingerprint": "<sha256 of the data config>",
     "config": {... the pipeline's data config, seed and canonical_replicas included ...},
     "lanes": {"<lane>": {"window": w, "offset": o, "batches_delivered": b, "finished": f}},
     "pointers": {"<worker>/<active_workers>:<owned lanes>": <next lane>},
     "step": {"global_step": s, "batches_in_step": i, "batches_per_step": n, "dp_degree": d}}

``window``/``offset`` is where the lane's next undelivered sample sits: the
lane's ``offset``-th sample of its window ``window``. Only lanes a rank owns
appear in its state; :func:`~zephon_dask.state.merge_states` joins ranks.
"""

from __future__ import annotations

from typing import Any

from ..errors import StateError

FORMAT = "zephon_dask.state"
VERSION = 1
LANE_FIELDS = ("window", "offset", "batches_delivered", "finished")
STEP_FIELDS = ("global_step", "batches_in_step", "batches_per_step", "dp_degree")


class StateDict(dict):
    """A state: a plain ``dict`` (JSON-serialisable as is) that renders as tables in a notebook."""

    def _repr_html_(self) -> str:
        from ..inspect.reprs import state_html

        return state_html(self)


def pointer_key(worker: int, active_workers: int, lanes: list[int]) -> str:
    """``"<worker>/<active_workers>:<owned lanes>"``: never a rank, so DP peers share it."""
    return f"{worker}/{active_workers}:{','.join(str(lane) for lane in lanes)}"


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_state(state: Any, where: str = "state") -> dict:
    """Validate a state's structure; return it. Raises :class:`StateError` naming the fault."""
    if not isinstance(state, dict):
        raise StateError(f"{where} must be a dict from Pipeline.state_dict(), got {type(state).__name__}")
    if state.get("format") != FORMAT:
        raise StateError(f"{where} has format {state.get('format')!r}, expected {FORMAT!r}: "
                         "pass a dict from Pipeline.state_dict() or zephon_dask.load_state()")
    version = state.get("version")
    if not _is_count(version):
        raise StateError(f"{where} has version {version!r}; expected an int")
    if version > VERSION:
        raise StateError(f"{where} has version {version}, newer than this zephon_dask understands "
                         f"({VERSION}); upgrade zephon_dask to resume from it")
    missing = [k for k in ("fingerprint", "config", "lanes", "pointers", "step") if k not in state]
    if missing:
        raise StateError(f"{where} lacks {missing}: it is truncated or not a zephon_dask state")
    if not isinstance(state["fingerprint"], str) or not isinstance(state["config"], dict):
        raise StateError(f"{where} has a malformed fingerprint or config")
    lanes = state["lanes"]
    if not isinstance(lanes, dict):
        raise StateError(f"{where}['lanes'] must be a dict of lane id -> progress")
    for lane, progress in lanes.items():
        ok = (isinstance(lane, str) and lane.isdigit() and isinstance(progress, dict)
              and sorted(progress) == sorted(LANE_FIELDS)
              and all(_is_count(progress[k]) for k in LANE_FIELDS[:3])
              and isinstance(progress["finished"], bool))
        if not ok:
            raise StateError(f"{where}['lanes'][{lane!r}] = {progress!r} is malformed; expected "
                             f"{{{', '.join(LANE_FIELDS)}}} with non-negative ints and a bool")
    pointers = state["pointers"]
    if not isinstance(pointers, dict) or not all(isinstance(k, str) and _is_count(v) for k, v in pointers.items()):
        raise StateError(f"{where}['pointers'] = {pointers!r} must map keys to lane ids")
    step = state["step"]
    if not isinstance(step, dict) or sorted(step) != sorted(STEP_FIELDS) or not all(_is_count(v) for v in step.values()):
        raise StateError(f"{where}['step'] = {step!r} is malformed; expected {{{', '.join(STEP_FIELDS)}}}")
    return state


def lanes_of(state: dict) -> dict[int, dict]:
    """The state's lane progress keyed by int lane id, in lane order."""
    return {int(lane): dict(p) for lane, p in sorted(state["lanes"].items(), key=lambda kv: int(kv[0]))}


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
    a, b = {}, {}
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
