"""Checkpoint files: atomic writes and checked reads.

:func:`save_state` writes canonical JSON with a SHA-256 of the state to a
temporary file in the same folder, fsyncs it and renames it over the target,
so a crash leaves either the old file or the new one. :func:`load_state`
refuses a truncated, corrupted or foreign file with a :class:`StateError`.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from ..errors import StateError
from .schema import check_state


def _digest(state: dict) -> str:
    body = json.dumps(state, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(body.encode()).hexdigest()


def save_state(path, state: dict) -> Path:
    """Write ``state`` to ``path`` atomically (temp file + fsync + rename); returns the path."""
    state = check_state(state)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"sha256": _digest(state), "state": state}
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(payload, f, sort_keys=True, indent=1, allow_nan=False)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_state(path) -> dict:
    """Read a state written by :func:`save_state`, verifying its checksum and schema."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise StateError(f"no checkpoint at {str(path)!r}") from None
    try:
        payload = json.loads(text)
    except ValueError as exc:
        raise StateError(f"checkpoint {str(path)!r} is truncated or corrupted (not valid JSON: {exc}); "
                         "resume from an earlier checkpoint") from None
    if not isinstance(payload, dict) or set(payload) != {"sha256", "state"}:
        raise StateError(f"{str(path)!r} is not a zephon_dask checkpoint file (write it with save_state)")
    state = payload["state"]
    if not isinstance(state, dict) or _digest(state) != payload["sha256"]:
        raise StateError(f"checkpoint {str(path)!r} is corrupted: its checksum does not match; "
                         "resume from an earlier checkpoint")
    return check_state(state, where=f"checkpoint {str(path)!r}")
