"""What the caller sees while the first batch is computed. Holds state (a timer thread and a bar).

The first batch waits for its lane's first window, which can take seconds on a
cold cluster; :class:`FirstBatchWait` logs the windows submitted, and when the
wait outlasts :data:`SHOW_AFTER` seconds shows a progress bar of the windows in
flight (a notebook widget or a terminal bar), updated by a daemon thread that
only reads the handles' ``done()``. The waiting itself stays in the caller's
thread, with the runner's own deadlines: this module never waits on the cluster.
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

    def __enter__(self) -> FirstBatchWait:
        self._started = time.perf_counter()
        logger.info("%d window(s) submitted for the first batch (lanes %s)", len(self.fetcher.inflight),
                    self.fetcher.lanes)
        # the synchronous runner computes in this thread when asked: nothing runs meanwhile to show
        if getattr(self.fetcher.runner, "name", "") != "synchronous":
            self._thread = threading.Thread(target=self._watch, name="zephon-first-batch", daemon=True)
            self._thread.start()
        return self

    def _done(self) -> tuple[int, int]:
        try:
            handles = list(self.fetcher.inflight.values())
        except RuntimeError:  # the dict changed while being copied; the next tick reads it again
            return 0, 0
        return sum(1 for h in handles if h.done()), len(handles)

    def _watch(self) -> None:
        if self._stop.wait(self.show_after):
            return
        done, total = self._done()
        with progress_bar(total=total, desc="computing the first windows", unit="window", leave=False,
                          disable=None) as bar:  # a bar only on a terminal or in a notebook
            while not self._stop.wait(TICK):
                done, total = self._done()
                bar.total = max(total, done)
                bar.n = done
                bar.refresh()

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        logger.info("first batch after %.2f s", time.perf_counter() - self._started)
