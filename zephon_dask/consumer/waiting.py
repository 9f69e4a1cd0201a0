"""What the caller sees while the first batch is computed. Holds state (a timer thread and a bar).

The first batch waits for its lane's first window, which can take seconds on a
cold cluster; :class:`FirstBatchWait` logs the windows submitted for it and the
documents they hold, and when the wait outlasts :data:`SHOW_AFTER` seconds
shows a progress bar of those documents (a notebook widget or a terminal bar):
a window's documents count once its chunk tasks finish, chunk by chunk where
the runner sees them (a window split into chunk tasks, a window computed in this
process while the embedded cluster starts), else when the window is done. A
daemon thread updates it, reading only the handles' ``chunks_done()``. The
waiting itself stays in the caller's thread, with the runner's own deadlines:
this module never waits on the cluster.
"""

from __future__ import annotations

import threading
import time

from ..log import logger
from ..progress_bar import progress_bar

SHOW_AFTER = 2.0  # seconds of waiting before a bar appears
TICK = 0.25  # seconds between two bar updates


class FirstBatchWait:
    """``with FirstBatchWait(fetcher): first = next(stream)``: logs and, if slow, a bar."""

    def __init__(self, fetcher, show_after: float | None = None):
        self.fetcher = fetcher
        self.show_after = SHOW_AFTER if show_after is None else show_after
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = 0.0
        self._handles: list = []  # the windows submitted for the first batch, kept as they are taken
        self._chunk_size = fetcher.spec.source.chunk_size

    def __enter__(self) -> FirstBatchWait:
        self._started = time.perf_counter()
        self._handles = list(self.fetcher.inflight.values())
        _, total = self.progress()
        logger.info("%d window(s) submitted for the first batch (lanes %s): %s documents to read",
                    len(self._handles), self.fetcher.lanes, f"{total:,}")
        # a runner that computes in this thread when asked runs nothing meanwhile to show
        if not getattr(self.fetcher.runner, "computes_in_caller", False):
            self._thread = threading.Thread(target=self._watch, name="zephon-first-batch", daemon=True)
            self._thread.start()
        return self

    def progress(self) -> tuple[int, int]:
        """``(documents done, documents)`` of the windows submitted for the first batch."""
        size = self._chunk_size
        done = sum(h.chunks_done() for h in self._handles) * size
        return done, sum(len(getattr(h.graph, "chunks", ())) for h in self._handles) * size

    def _watch(self) -> None:
        if self._stop.wait(self.show_after):
            return
        done, total = self.progress()
        with progress_bar(total=total, initial=done, desc=f"first batch: {len(self._handles)} windows",
                          unit="doc", leave=False, disable=None) as bar:  # a bar only on a terminal or notebook
            while not self._stop.wait(TICK):
                bar.n = self.progress()[0]
                bar.refresh()
            bar.n = self.progress()[0]  # where it got to, drawn once more before it goes
            bar.refresh()

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._handles = []
        logger.info("first batch after %.2f s", time.perf_counter() - self._started)
