"""The run ledger: one JSON line per delivered batch, and its verification.

``DIR/rank-<global rank>.jsonl`` gets ``{"global_step", "lane",
"index_in_lane", "sha256"}`` per batch, appended and flushed as the batch is
handed over. :func:`verify_ledgers` compares two runs step by step. Ledgers
are read as sets keyed by ``(global_step, lane, index_in_lane)``, so which
rank served a lane does not matter, and a batch logged again after a crash
and a resume from an earlier checkpoint is not counted twice. A run that
appends to a ledger whose last line a crash cut short first truncates that
partial line (with a warning): the resumed run logs its batches again.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections import defaultdict
from pathlib import Path

import numpy as np

from ..errors import StateError, ZephonWarning, user_stacklevel


def batch_digest(tokens) -> str:
    """SHA-256 of a batch's token matrix (shape and int64 little-endian values)."""
    arr = np.ascontiguousarray(np.asarray(tokens), dtype="<i8")
    h = hashlib.sha256(repr(tuple(arr.shape)).encode())
    h.update(arr.tobytes())
    return h.hexdigest()


class LedgerWriter:
    """Appends to ``DIR/rank-<rank>.jsonl``. Holds an open file."""

    def __init__(self, directory, rank: int):
        self.path = Path(directory) / f"rank-{rank}.jsonl"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            _repair_torn_tail(self.path)
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (closed by close())
        except (FileExistsError, NotADirectoryError):
            raise StateError(f"ledger folder {str(directory)!r} is a file; give a folder for the "
                             "rank-<n>.jsonl files") from None
        except IsADirectoryError:
            raise StateError(f"ledger file {str(self.path)!r} is a directory; remove it or choose "
                             "another ledger folder") from None
        except OSError as exc:
            raise StateError(f"cannot open the ledger {str(self.path)!r}: {exc}") from None

    def write(self, global_step: int, lane: int, index_in_lane: int, tokens) -> None:
        record = {"global_step": global_step, "lane": lane, "index_in_lane": index_in_lane,
                  "sha256": batch_digest(tokens)}
        self._file.write(json.dumps(record, sort_keys=True) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def _repair_torn_tail(path: Path) -> None:
    """Cut a last line that does not end in a newline (a write a crash interrupted)."""
    try:
        with open(path, "rb+") as f:
            size = f.seek(0, os.SEEK_END)
            if not size:
                return
            f.seek(max(0, size - 65536))
            tail = f.read()
            if tail.endswith(b"\n"):
                return
            cut = tail.rfind(b"\n")
            keep = size - len(tail) + cut + 1 if cut >= 0 else 0
            if cut < 0 and size > len(tail):
                raise StateError(f"ledger {str(path)!r} ends in a line over 64 KiB without a newline: "
                                 "it is not a ledger; move it away")
            f.truncate(keep)
    except FileNotFoundError:
        return
    warnings.warn(f"ledger {str(path)!r}: its last line was cut short by a crash ({size - keep} bytes); "
                  "removed it before appending", ZephonWarning, stacklevel=user_stacklevel())


def read_ledger(directory) -> dict[int, dict[tuple[int, int], str]]:
    """``{global_step: {(lane, index_in_lane): sha256}}`` from every ``rank-*.jsonl`` in ``directory``."""
    directory = Path(directory)
    files = sorted(directory.glob("rank-*.jsonl"))
    if not files:
        raise StateError(f"no ledger in {str(directory)!r}: expected rank-<n>.jsonl files written "
                         "by a pipeline with .options(ledger=DIR)")
    steps: dict[int, dict[tuple[int, int], str]] = defaultdict(dict)
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except IsADirectoryError:
            raise StateError(f"{path} is a directory, not a ledger file; move it away") from None
        except UnicodeDecodeError:
            raise StateError(f"{path} is a binary file, not a ledger (JSON lines); move it away") from None
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                step, key, digest = rec["global_step"], (rec["lane"], rec["index_in_lane"]), rec["sha256"]
            except (ValueError, KeyError, TypeError) as exc:
                raise StateError(f"{path}:{n} is not a ledger record ({exc}): {line[:80]!r}") from None
            seen = steps[step].get(key)
            if seen is not None and seen != digest:
                raise StateError(f"{path}:{n}: lane {key[0]} batch {key[1]} at step {step} was logged "
                                 "twice with different contents; the run was not deterministic")
            steps[step][key] = digest
    return dict(steps)


def gaps(steps) -> list[tuple[int, int]]:
    """Runs ``(first, last)`` of global steps missing between the lowest and highest of ``steps``. Pure."""
    have = sorted(steps)
    return [(lo + 1, hi - 1) for lo, hi in zip(have, have[1:], strict=False) if hi - lo > 1]


def _partial_tail(steps: dict[int, dict], other: dict[int, dict]) -> int | None:
    """The last global step of ``steps`` when it holds only some of the batches ``other`` holds at
    that step (its run ended, or was stopped, inside the step), else ``None``. Pure."""
    last = max(steps)
    return last if last in other and set(steps[last]) < set(other[last]) else None


def verify_ledgers(dir_a, dir_b) -> tuple[bool, str]:
    """Whether two runs' ledgers agree: every complete global step both cover holds the same
    batches, and neither misses a step inside its own range.

    A ledger whose last step holds only some of the batches the other holds at that step (its run
    ended, or was stopped, inside the step) has a trailing partial step: the batches it holds are
    compared with the other's, the report says how far it got, and it is not a difference by itself.

    Args:
        dir_a: the ledger directory of one run (``options(ledger=...)``).
        dir_b: the ledger directory of the other (e.g. the resumed run).

    Returns:
        ``(same, report)``: whether they agree, and a readable report naming the
        first difference or gap, and a trailing partial step.

    Example:
        >>> same, report = zephon_dask.verify_ledgers("run-a/ledger", "run-b/ledger")  # doctest: +SKIP
    """
    a, b = read_ledger(dir_a), read_ledger(dir_b)
    for label, steps in (("A", a), ("B", b)):
        missing = gaps(steps)
        if missing:
            runs = ", ".join(f"{lo}" if lo == hi else f"{lo}..{hi}" for lo, hi in missing[:4])
            more = f" and {len(missing) - 4} more runs" if len(missing) > 4 else ""
            return False, (f"ledger {label} lacks global steps {runs}{more} between its first and last "
                           f"({min(steps)}..{max(steps)}): batches were lost or the ledger was cut")
    partial = {"A": _partial_tail(a, b), "B": _partial_tail(b, a)}
    for step in sorted(set(a) & set(b)):
        if step in partial.values():  # the batches both hold
            shared = set(a[step]) & set(b[step])
            left, right = {k: a[step][k] for k in shared}, {k: b[step][k] for k in shared}
        else:
            left, right = a[step], b[step]
        if left != right:
            only_a = sorted(set(left.items()) - set(right.items()))
            only_b = sorted(set(right.items()) - set(left.items()))
            detail = "; ".join(
                [f"A has lane {lane} batch {i} ({d[:12]})" for (lane, i), d in only_a[:4]]
                + [f"B has lane {lane} batch {i} ({d[:12]})" for (lane, i), d in only_b[:4]]
            )
            return False, f"global step {step} differs: {detail}"
    common = sorted(s for s in set(a) & set(b) if s not in partial.values())
    tails = "".join(
        f"; ledger {label} ends inside global step {cut}: it holds {len(steps[cut])} of the "
        f"{len(other[cut])} batches {them} holds there, identical (the step is not counted)"
        for label, them, steps, other in (("A", "B", a, b), ("B", "A", b, a))
        if (cut := partial[label]) is not None
    )
    if not common:
        return False, f"the ledgers share no complete global step ({len(a)} and {len(b)} steps){tails}"
    batches = sum(len(a[s]) for s in common)
    return True, f"{len(common)} global steps ({common[0]}..{common[-1]}), {batches} batches: identical{tails}"
