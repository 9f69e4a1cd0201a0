"""``torch.distributed``, if the user started it: the one place the package asks. Pure.

Never imports torch: a process that did not import ``torch.distributed`` has
not initialised it.
"""

from __future__ import annotations

import sys
from typing import Any


def initialized(several: bool = False) -> Any:
    """``torch.distributed`` if it is available and initialised (with ``several``: with more than
    one rank), else ``None``."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not (dist.is_available() and dist.is_initialized()):
        return None
    if several and dist.get_world_size() <= 1:
        return None
    return dist


def _reduce(flag: bool, op: str) -> bool:
    dist = initialized(several=True)
    if dist is None:
        return flag
    import torch

    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    vote = torch.tensor([int(flag)], dtype=torch.int32, device=device)
    dist.all_reduce(vote, op=getattr(dist.ReduceOp, op))
    return bool(vote.item())


def any_rank(flag: bool) -> bool:
    """Whether ``flag`` is true on any rank (a collective: every rank calls it; alone, ``flag``).
    Waits as long as the process group's own ``timeout``."""
    return _reduce(flag, "MAX")


def every_rank(flag: bool) -> bool:
    """Whether ``flag`` is true on every rank (a collective, as :func:`any_rank`)."""
    return _reduce(flag, "MIN")
