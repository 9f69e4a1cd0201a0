"""Which data-parallel group this process is, and the lanes it owns. Pure; holds no state.

The DP identity comes from the ``dp_degree`` / ``dp_group_id`` options, else
from ``torch.distributed`` when the user initialised it (never imported
here), else ``(1, 0)``; the lanes follow from ``canonical_replicas`` and
``mapping_strategy``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import torch_dist
from ..curriculum.routing import group_lanes
from ..errors import ConfigError


def dp_identity(settings: Mapping[str, Any]) -> tuple[int, int]:
    """``(dp_degree, dp_group_id)`` (see ``Session.identity``); :class:`ConfigError` if the group
    is not below the degree."""
    degree, group = settings["dp_degree"], settings["dp_group_id"]
    dist = torch_dist.initialized() if degree is None or group is None else None
    if dist is not None:
        degree = dist.get_world_size() if degree is None else degree
        group = dist.get_rank() if group is None else group
    degree = 1 if degree is None else degree
    group = 0 if group is None else group
    if group >= degree:
        raise ConfigError(f"dp_group_id={group} must be < dp_degree={degree}")
    return degree, group


def owned_lanes(settings: Mapping[str, Any]) -> list[int]:
    """The lanes this DP group owns, in the order the round-robin visits them."""
    degree, group = dp_identity(settings)
    return group_lanes(settings["canonical_replicas"], degree, settings["mapping_strategy"])[group]


def process_rank(settings: Mapping[str, Any]) -> int:
    """This process's rank (it names the ledger file): ``torch.distributed``'s when initialised,
    else the DP group."""
    dist = torch_dist.initialized()
    return dist.get_rank() if dist is not None else dp_identity(settings)[1]
