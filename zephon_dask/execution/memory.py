"""Giving freed memory back to the OS (:func:`trim_freed_memory`, :class:`Trimmer`) and measuring it.

Windows are large arrays that come and go. glibc keeps much of the memory they
free for later allocations, so a streaming process's RSS drifts up by tens of
MB over the first half hour although the memory in use stays flat. Dask's
nanny counters this by exporting ``MALLOC_TRIM_THRESHOLD_=65536``, which trims
on every large free and made tokenize + pack ~20% slower in the embedded
cluster's workers (which therefore keep glibc's default thresholds); here memory is
trimmed instead: in the embedded cluster's workers when a task ends (at most
once a second) and every :data:`TRIM_EVERY` seconds (the distributed runner's
worker plugin), and in the consumer between windows, at most every
:data:`TRIM_EVERY` seconds. The trim shrinks only the top of glibc's main heap
(it frees whole pages inside every heap), so the embedded cluster's workers
run with one heap (``MALLOC_ARENA_MAX=1``, see the cluster's defaults).
:func:`malloc_in_use` and :func:`python_small_objects` tell live memory from
memory kept (the soak benchmark asks every process for them).
Trimming never changes data; on a C library without ``malloc_trim`` it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable

TRIM_EVERY = 30.0  # seconds between two trims of one process
# the training process's: windows come and go there every second or so, and the head start's leave
# tens of MiB freed; a trim costs ~1 ms of CPU, 5-10 ms when it returns that much
CONSUMER_TRIM_EVERY = 5.0


@functools.cache
def _libc_function(name: str):
    """The C library's function ``name``; ``None`` where there is none (not glibc, or an older one)."""
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
    except (OSError, AttributeError):
        return None


def trim_freed_memory() -> bool:
    """Return the C library's free memory to the OS (glibc's ``malloc_trim(0)``); ``False`` where
    there is no such call. Holds no state."""
    trim = _libc_function("malloc_trim")
    return bool(trim is not None and trim(0) >= 0)


class Trimmer:
    """Trims at most once every ``every`` seconds (of ``clock``) when :meth:`maybe` is called.
    Holds its last time."""

    def __init__(self, every: float = TRIM_EVERY, clock: Callable[[], float] = time.monotonic):
        self.every, self._clock = every, clock
        self._last = clock()

    def maybe(self) -> None:
        now = self._clock()
        if now - self._last >= self.every:
            self._last = now
            trim_freed_memory()


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


@functools.cache
def _mallinfo2():
    call = _libc_function("mallinfo2")  # glibc 2.33 and later
    if call is not None:
        call.restype = _MallInfo2
    return call


def malloc_in_use() -> int | None:
    """Bytes this process has in use through ``malloc`` (glibc's ``mallinfo2``: allocated heap
    chunks plus mmapped blocks), ``None`` without it. Unlike RSS it excludes memory freed but
    kept by the allocator (and Python's small objects, which live in arenas of Python's own),
    so arrays and buffers that pile up show here and fragmentation does not. Holds no state."""
    call = _mallinfo2()
    if call is None:
        return None
    info = call()
    return int(info.uordblks + info.hblkhd)


_PYMALLOC_LINES = {"live": re.compile(rb"^# bytes in allocated blocks\s*=\s*([\d,]+)", re.M),
                   "arenas": re.compile(rb"^\d+ arenas \* \d+ bytes/arena\s*=\s*([\d,]+)", re.M)}


def python_small_objects() -> tuple[int, int] | None:
    """``(live, arenas)``: bytes of Python's small objects alive, and bytes of the arenas Python's
    own allocator (pymalloc) holds for them, ``None`` where it does not say. :func:`malloc_in_use`
    leaves both out (the arenas do not come from ``malloc``); arenas minus live is mostly memory freed
    but kept, one arena (1 MiB) given back only once all its objects are gone. Read from
    ``sys._debugmallocstats``, which prints to the C stderr: file descriptor 2 points to a
    temporary file for the call (about 1 ms), so another thread's writes to it then are lost. For
    benchmarks; holds no state."""
    stats = getattr(sys, "_debugmallocstats", None)
    if stats is None:
        return None
    with tempfile.TemporaryFile() as tmp:
        if sys.stderr is not None:  # what Python buffered goes out first, not into the file
            sys.stderr.flush()
        saved = os.dup(2)
        try:
            os.dup2(tmp.fileno(), 2)
            stats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        tmp.seek(0)
        text = tmp.read()
    found = {key: line.search(text) for key, line in _PYMALLOC_LINES.items()}
    if found["live"] is None or found["arenas"] is None:
        return None
    return int(found["live"].group(1).replace(b",", b"")), int(found["arenas"].group(1).replace(b",", b""))


def allocator_stats() -> tuple[int | None, int | None, int | None]:
    """This process's :func:`malloc_in_use` and :func:`python_small_objects` (live, arenas), in
    bytes, ``None`` where unknown: one call a benchmark asks of every process. Holds no state."""
    small = python_small_objects()
    return (malloc_in_use(), *(small or (None, None)))
