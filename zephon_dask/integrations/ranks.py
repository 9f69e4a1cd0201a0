"""The pipeline state over all ranks, for frameworks that save one rank's copy. Imports no framework."""

from __future__ import annotations

import sys

from ..state import gather_state


def collective_state(pipeline) -> dict:
    """The pipeline's (consumed) state with every rank's lanes.

    A collective under an initialised ``torch.distributed`` with several
    ranks (every rank must call it; each gets the merged state), else the
    pipeline's own state.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return gather_state(pipeline)
    return pipeline.state_dict()
