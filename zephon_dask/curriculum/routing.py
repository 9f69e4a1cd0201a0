"""Chunks -> lanes -> DP groups -> DataLoader workers. Pure.

Global chunk ``g`` lies in block ``b = g // R`` at slot ``s = g % R``. With
``"modulo"`` assignment its lane is ``s``; with ``"permute"`` it is
``perm_b(s)`` for a bijection of ``range(R)`` keyed by ``(seed, R, b)``. Every
block hands every lane exactly one chunk, so lane ``l``'s ``j``-th chunk is
``j * R + perm_j^-1(l)``: found in O(1), with no rank talking to another.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError, ElasticityWarning, user_stacklevel
from ..options import MAPPING_STRATEGIES
from ..validate import check_choice, check_int
from .permutation import permute, permute_each
from .seeding import stream_keys

LANE_ASSIGNMENTS = ("permute", "modulo")


def check_replicas(canonical_replicas: object) -> int:
    """Validate ``canonical_replicas`` (R): a positive integer."""
    return check_int(canonical_replicas, "canonical_replicas", 1,
                     hint="size it for the largest data-parallel degree you expect, e.g. 8")


def _lane_keys(seed: int, replicas: int, block: int) -> tuple[int, ...]:
    return stream_keys(seed, "lane-permute", replicas, block)


def lane_of(g: int, replicas: int, seed: int, assignment: str = "permute") -> int:
    """The lane that owns global chunk ``g``."""
    block, slot = divmod(g, replicas)
    if assignment == "modulo":
        return slot
    return int(permute([slot], replicas, _lane_keys(seed, replicas, block))[0])


def slot_of(lane: int, block: int, replicas: int, seed: int, assignment: str = "permute") -> int:
    """The slot of block ``block`` whose chunk belongs to ``lane`` (inverse of :func:`lane_of`)."""
    if assignment == "modulo":
        return lane
    keys = _lane_keys(seed, replicas, block)
    return int(permute([lane], replicas, keys, inverse=True)[0])


def slots_of(lane: int, blocks, replicas: int, seed: int, assignment: str = "permute") -> np.ndarray:
    """:func:`slot_of` for each of ``blocks`` (array-like of ints), in one vectorised pass; int64."""
    blocks = np.asarray(blocks, dtype=np.int64)
    if assignment == "modulo":
        return np.full(blocks.shape, lane, dtype=np.int64)
    keys = np.array([_lane_keys(seed, replicas, b) for b in blocks.tolist()], dtype=np.uint64)
    return permute_each(np.full(blocks.shape, lane, dtype=np.int64), replicas,
                        keys.reshape(len(blocks), -1), inverse=True)


def check_degree(replicas: int, dp_degree: object) -> int:
    """Validate a DP degree against R: error above R, warning when it does not divide R."""
    degree: int = check_int(dp_degree, "dp_degree", 1)
    if degree > replicas:
        raise ConfigError(
            f"dp_degree={degree} exceeds canonical_replicas={replicas}: some DP groups would "
            f"own no lane. Use dp_degree <= {replicas}, or start the run with canonical_replicas "
            f">= {degree}"
        )
    if replicas % degree:
        warnings.warn(
            f"canonical_replicas={replicas} is not divisible by dp_degree={degree}: some groups "
            "own one more lane than others and do more work per step. Prefer a degree that "
            f"divides {replicas}",
            ElasticityWarning,
            stacklevel=user_stacklevel(),
        )
    return degree


def group_lanes(replicas: int, dp_degree: int, mapping: str = "contiguous") -> list[list[int]]:
    """Lanes owned by each DP group (validates the degree and mapping)."""
    check_choice(mapping, MAPPING_STRATEGIES, "mapping_strategy")
    check_degree(replicas, dp_degree)
    if mapping == "interleaved":
        return [list(range(g, replicas, dp_degree)) for g in range(dp_degree)]
    base, extra = divmod(replicas, dp_degree)
    out, start = [], 0
    for g in range(dp_degree):
        size = base + (1 if g < extra else 0)
        out.append(list(range(start, start + size)))
        start += size
    return out


def worker_lanes(lanes: list[int], num_workers: int) -> list[list[int]]:
    """Split a group's lanes over DataLoader workers (``docs/distributed.md``, DataLoader workers).

    The active count ``a`` is the largest divisor of ``len(lanes)`` not above
    ``num_workers``; worker ``i < a`` owns ``lanes[i::a]``, the rest own none.
    Polling workers in order then replays strict round-robin over ``lanes``.
    """
    if num_workers < 1:
        return [list(lanes)]
    n = len(lanes)
    active = max((a for a in range(1, min(num_workers, n) + 1) if n % a == 0), default=1)
    return [list(lanes[i::active]) if i < active else [] for i in range(num_workers)]


@dataclass(frozen=True)
class Plan:
    """Who owns which lane for one ``(R, dp_degree, mapping)`` (immutable)."""

    canonical_replicas: int
    dp_degree: int
    mapping_strategy: str
    groups: tuple[tuple[int, ...], ...]

    @property
    def imbalance(self) -> float:
        """Largest group's lane count over the mean (1.0 is perfectly balanced)."""
        sizes = [len(g) for g in self.groups]
        return max(sizes) * len(sizes) / sum(sizes)

    def rows(self) -> list[dict]:
        return [{"group": i, "lanes": list(g)} for i, g in enumerate(self.groups)]

    def __str__(self) -> str:
        head = (
            f"canonical_replicas={self.canonical_replicas} dp_degree={self.dp_degree} "
            f"mapping={self.mapping_strategy} imbalance={self.imbalance:.2f}"
        )
        return "\n".join([head, *(f"  group {i}: lanes {list(g)}" for i, g in enumerate(self.groups))])


def plan(replicas: int, dp_degree: int, mapping: str = "contiguous") -> Plan:
    """The lane-to-group assignment table."""
    groups = group_lanes(check_replicas(replicas), dp_degree, mapping)
    return Plan(replicas, dp_degree, mapping, tuple(tuple(g) for g in groups))


def check_step(batches_per_step: object, dp_degree: int, replicas: int) -> int:
    """Validate ``batches_per_step``: a global step is elastic only if ``N * dp_degree % R == 0``."""
    n = check_int(batches_per_step, "batches_per_step", 1, hint="batches one rank takes per step")
    if (n * dp_degree) % replicas:
        every = replicas // math.gcd(replicas, dp_degree)
        degree = replicas // math.gcd(replicas, n)
        raise ConfigError(
            f"batches_per_step={n} x dp_degree={dp_degree} = {n * dp_degree} batches per global step is "
            f"not a multiple of canonical_replicas={replicas}, so a step would depend on the topology. "
            f"At dp_degree={dp_degree} use a multiple of {every} (the nearest is {-(-n // every) * every}); "
            f"with batches_per_step={n} use a dp_degree that is a multiple of {degree}"
        )
    return n
