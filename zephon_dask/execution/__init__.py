"""Runners: where window graphs execute. None of them can change a byte of the data.

:mod:`.base` is the contract, :mod:`.local` and :mod:`.runner` the runners
(:mod:`.handle` a window's tasks on a cluster, :mod:`.head_start` the first windows
computed here while the embedded cluster starts), :mod:`.cluster` the embedded
cluster's lifecycle, :mod:`.connect` Dask for other jobs, :mod:`.watch` the
bounded waits on a cluster, :mod:`.task_errors` the errors a task returns
instead of raising, :mod:`.registry` the names and the choice between them.
"""

from .base import Runner, WindowHandle
from .registry import RUNNERS, choose_runner, make_runner

__all__ = ["RUNNERS", "Runner", "WindowHandle", "choose_runner", "make_runner"]
