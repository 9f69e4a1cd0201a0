"""The run ledger: one JSON line per delivered batch, and its verification.

``DIR/rank-<global rank>.jsonl`` gets ``{"global_step", "lane",
"index_in_lane", "sha256"}`` per batch, appended and flushed as the batch is
handed over. :func:`verify_ledgers` compares two runs step by step. Ledgers
are read as sets keyed by ``(global_step, lane, index_in_lane)``, so which
rank served a lane does not matter, and a batch logged again after a crash
and a resume from an earlier checkpoint is not counted twice.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from ..errors import StateError


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
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (closed by close())

    def write(self, global_step: int, lane: int, index_in_lane: int, tokens) -> None:
        record = {"global_step": global_step, "lane": lane, "index_in_lane": index_in_lane,
                  "sha256": batch_digest(tokens)}
        self._file.write(json.dumps(record, sort_keys=True) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_ledger(directory) -> dict[int, dict[tuple[int, int], str]]:
    """``{global_step: {(lane, index_in_lane): sha256}}`` from every ``rank-*.jsonl`` in ``directory``."""
    directory = Path(directory)
    files = sorted(directory.glob("rank-*.jsonl"))
    if not files:
        raise StateError(f"no ledger in {str(directory)!r}: expected rank-<n>.jsonl files written "
                         "by a pipeline with .options(ledger=DIR)")
    steps: dict[int, dict[tuple[int, int], str]] = defaultdict(dict)
    for path in files:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
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


def verify_ledgers(dir_a, dir_b) -> tuple[bool, str]:
    """Whether every global step both ledgers cover holds the same batches, and a report."""
    a, b = read_ledger(dir_a), read_ledger(dir_b)
    common = sorted(set(a) & set(b))
    if not common:
        return False, f"the ledgers share no global step ({len(a)} and {len(b)} steps)"
    for step in common:
        if a[step] != b[step]:
            only_a = sorted(set(a[step].items()) - set(b[step].items()))
            only_b = sorted(set(b[step].items()) - set(a[step].items()))
            detail = "; ".join(
                [f"A has lane {lane} batch {i} ({d[:12]})" for (lane, i), d in only_a[:4]]
                + [f"B has lane {lane} batch {i} ({d[:12]})" for (lane, i), d in only_b[:4]]
            )
            return False, f"global step {step} differs: {detail}"
    batches = sum(len(a[s]) for s in common)
    return True, f"{len(common)} global steps ({common[0]}..{common[-1]}), {batches} batches: identical"
