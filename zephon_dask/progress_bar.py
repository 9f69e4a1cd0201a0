"""Progress bars that never warn: a notebook widget where ipywidgets is installed, text elsewhere. Pure.

``tqdm.auto`` warns (``TqdmWarning: IProgress not found``) in a notebook without
ipywidgets, and importing it at package import time put that warning in every
notebook's first cell; :func:`progress_bar` imports tqdm only when a bar is made.
"""

from __future__ import annotations

import importlib.util
from typing import Any


def progress_bar(**kwargs: Any):
    """A ``tqdm`` bar (``kwargs`` go to ``tqdm``): ``tqdm.auto``'s choice when ipywidgets is
    installed, the text bar otherwise."""
    if importlib.util.find_spec("ipywidgets") is not None:
        from tqdm.auto import tqdm
    else:
        from tqdm.std import tqdm
    return tqdm(**kwargs)
