"""Runners: where window graphs execute. None of them can change a byte of the data."""

from .runners import RUNNERS, Runner, WindowHandle, make_runner

__all__ = ["RUNNERS", "Runner", "WindowHandle", "make_runner"]
