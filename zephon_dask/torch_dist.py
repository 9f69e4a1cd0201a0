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
