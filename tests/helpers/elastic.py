"""One dataset's pipeline run on several data-parallel degrees, for the format oracles: a run
cut at a step on one degree and resumed on another delivers the uninterrupted single-rank run."""

from __future__ import annotations

import json
from collections import Counter

import zephon_dask as z
from tests.helpers.oracles import batch_rows

R = 4  # lanes; dp degrees 1, 2 and 4 divide it


def pipes(dataset, dp: int, seed: int = 3) -> list:
    """The pipeline of each of ``dp`` groups: tokenize, shuffle, pack, microbatches of 2."""
    ws = z.MixtureWorkSource([dataset], {dataset.name: 1}, chunk_size=8, seed=seed)
    return [
        z.Pipeline(ws).tokenize().shuffle(8).pack(48).batch(2).options(
            canonical_replicas=R, flush_every_k_chunks=1, runner="synchronous", dp_degree=dp,
            dp_group_id=g, batches_per_step=R // dp)
        for g in range(dp)
    ]


def steps(groups: list, n: int) -> list[Counter]:
    """``n`` optimizer steps of every group: per step, the multiset of its packed rows."""
    iters = [iter(p) for p in groups]
    out = []
    for _ in range(n):
        step: Counter = Counter()
        for it in iters:
            for _ in range(R // len(groups)):
                batch = next(it, None)
                if batch is not None:
                    step.update(tuple(row) for row in batch_rows(batch)[2])
        out.append(step)
    return out


def resumed(dataset, total: int, cut: int, dp_before: int, dp_after: int) -> list[Counter]:
    """``total`` steps: ``cut`` on ``dp_before`` groups, a checkpoint (through JSON), the rest on
    ``dp_after`` fresh groups loading it."""
    before = pipes(dataset, dp_before)
    head = steps(before, cut)
    state = json.loads(json.dumps(z.merge_states([p.state_dict() for p in before])))
    for p in before:
        p.close()
    after = pipes(dataset, dp_after)
    for p in after:
        p.load_state_dict(state)
    tail = steps(after, total - cut)
    for p in after:
        p.close()
    return head + tail
