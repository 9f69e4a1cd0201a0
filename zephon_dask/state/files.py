"""Checkpoint files: atomic writes and checked reads.

:func:`save_state` writes canonical JSON with a SHA-256 of the state to a
temporary file in the same folder, fsyncs it and renames it over the target,
and fsyncs the folder, so a crash leaves either the old file or the new one, and
a failed write (a full disk, a refused one) raises a :class:`StateError` naming
the path and leaves the previous checkpoint intact. A temporary file that a
killed save left behind is removed by the next save to that path once it is
:data:`STALE_TMP_SECONDS` old. A symlink target is written through (its
final file is replaced, the link is kept); a directory, device, FIFO or
socket at the path is refused. :func:`load_state` refuses a truncated,
corrupted, binary or foreign file with a :class:`StateError`.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import tempfile
import time
from pathlib import Path

from ..errors import StateError
from .schema import check_state


def _digest(state: dict) -> str:
    body = json.dumps(state, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(body.encode()).hexdigest()


STALE_TMP_SECONDS = 300  # a save takes seconds at most: older temp files are from killed saves


def _target(path: Path) -> Path:
    """The regular file a save replaces: ``path``, or the file a symlink there points to (written
    through, so the link stays). Anything else at the path is a :class:`StateError`."""
    real = Path(os.path.realpath(path)) if path.is_symlink() else path
    try:
        mode = real.stat().st_mode
    except FileNotFoundError:
        return real
    except OSError as exc:
        raise StateError(f"cannot write a checkpoint at {str(path)!r}: {exc}") from None
    if not stat.S_ISREG(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file (a device, FIFO or socket)"
        raise StateError(f"cannot write a checkpoint at {str(path)!r}: it is {kind}; give a file path, "
                         "e.g. ckpt/data.json")
    return real


def _sweep(path: Path) -> None:
    """Remove temp files of earlier saves to ``path`` that were killed (older than
    :data:`STALE_TMP_SECONDS`)."""
    cutoff = time.time() - STALE_TMP_SECONDS
    for old in path.parent.glob(f".{path.name}.*.tmp"):
        try:
            if old.is_file() and old.stat().st_mtime < cutoff:
                old.unlink()
        except OSError:  # removed meanwhile, or not ours to remove
            pass


def save_state(path, state: dict) -> Path:
    """Write ``state`` to ``path`` atomically (temp file + fsync + rename), with a checksum.

    A symlink at ``path`` is written through; missing parent directories are made.

    Args:
        path: the file to write (``str`` or ``Path``), e.g. ``ckpt/data.json``.
        state: a dict from ``pipeline.state_dict()`` (validated first).

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        StateError: ``state`` is malformed, or ``path`` is a directory or special
            file, or a parent of it is a file, or the system refused the write (a full
            disk, no permission): the message names the path and says that the previous
            checkpoint is intact. No other error is raised.

    Example:
        >>> zephon_dask.save_state("ckpt/data.json", pipeline.state_dict())  # doctest: +SKIP
    """
    state = check_state(state)
    given = Path(path)
    try:
        given.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise StateError(f"cannot write a checkpoint at {str(given)!r}: a parent of it is a file") from None
    except OSError as exc:
        raise StateError(f"cannot write a checkpoint at {str(given)!r}: its folder cannot be made "
                         f"({exc.strerror or exc})") from None
    path = _target(given)
    _sweep(path)
    payload = {"sha256": _digest(state), "state": state}
    previous = path.exists()
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise _write_failed(given, exc, previous) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(payload, f, sort_keys=True, indent=1, allow_nan=False)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise _write_failed(given, exc, previous) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _sync_folder(path.parent, given)
    return given


def _write_failed(path: Path, exc: OSError, previous: bool) -> StateError:
    """The error for a checkpoint write the system refused (``exc``: a full disk, no permission)."""
    kept = ("the previous checkpoint there is intact" if previous
            else "there was no checkpoint there before")
    return StateError(f"writing the checkpoint {str(path)!r} failed ({exc.strerror or exc}); nothing was "
                      f"replaced: {kept}; free space or choose another path, then save again")


def _sync_folder(folder: Path, given: Path) -> None:
    """fsync ``folder``, so the rename into it survives a power loss (a filesystem that cannot sync
    a folder is left as it is)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise StateError(f"the checkpoint {str(given)!r} was written but its folder could not be "
                             f"synced ({exc.strerror or exc}); a power loss now may lose it") from None
    finally:
        os.close(fd)


def load_state(path) -> dict:
    """Read a state written by :func:`save_state`, verifying its checksum and schema.

    Args:
        path: the file :func:`save_state` wrote.

    Returns:
        The state as a plain dict (an older version migrated), for
        ``pipeline.load_state_dict``.

    Raises:
        StateError: no file there, a directory, not JSON, a checksum mismatch
            (the file was edited or truncated) or a malformed state.

    Example:
        >>> pipeline.load_state_dict(zephon_dask.load_state("ckpt/data.json"))  # doctest: +SKIP
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise StateError(f"no checkpoint at {str(path)!r}") from None
    except IsADirectoryError:
        raise StateError(f"checkpoint path {str(path)!r} is a directory; give the file save_state wrote, "
                         "e.g. ckpt/data.json") from None
    except UnicodeDecodeError:
        raise StateError(f"checkpoint {str(path)!r} is a binary file, not a zephon_dask checkpoint (a "
                         "JSON file written by save_state); check the path") from None
    except OSError as exc:
        raise StateError(f"cannot read checkpoint {str(path)!r}: {exc}") from None
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
