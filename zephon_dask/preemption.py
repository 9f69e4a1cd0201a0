"""Stopping a training loop cleanly on SIGINT or SIGTERM. Holds state: the signal received.

SLURM and Kubernetes stop a job with SIGTERM and SIGKILL it a grace period later;
a terminal's Ctrl-C sends SIGINT to every process of the foreground group, and
``torchrun`` passes either on to its ranks. :class:`Preemption` installs handlers
for both (in the main thread, restored on exit) and turns the first signal into a
request the loop reads at its next step boundary, so the checkpoint it writes is
of a completed global step: :meth:`Preemption.should_stop` is ``True`` on every
rank once any rank has been signalled (a collective under ``torch.distributed``).
With ``at_once=True`` the first signal raises :class:`Preempted` where the
process is (a loop that can rewind to its last completed step:
``pipeline.state_dict(at_step=...)``). A second signal raises at once, unless it
comes within :data:`ECHO_S` of the first: a launcher passing on the signal its
whole process group received (``torchrun`` does) is the same request. Inside
:meth:`Preemption.deferred` (writing a checkpoint, an optimizer step) a signal waits until the
block ends. Functions given to :meth:`Preemption.before_raise` run just before
:class:`Preempted` is raised (an integration writing the checkpoint of the last completed step
there). The embedded Dask cluster's processes never act on a terminal's signals: the training
process decides.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from types import FrameType
from typing import Any

from . import torch_dist
from .errors import ConfigError

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
ECHO_S = 1.0  # seconds after the first signal during which another is the same request, passed on


class Preempted(KeyboardInterrupt):
    """A stop signal arrived: ``signum`` is the signal, ``exit_code`` the status a shell reports
    for it (``128 + signum``: 130 for SIGINT, 143 for SIGTERM). A ``KeyboardInterrupt``, so code
    that cleans up on Ctrl-C does the same on SIGTERM."""

    def __init__(self, signum: int):
        self.signum = int(signum)
        self.exit_code = 128 + self.signum
        super().__init__(f"stopped by {signal.Signals(self.signum).name}")


class Preemption:
    """``with Preemption() as stop:``: SIGINT and SIGTERM become a request to stop at the next step.

    Args:
        signals: the signals handled (default SIGINT and SIGTERM).
        at_once: raise :class:`Preempted` when the first signal arrives, instead of only
            recording it for :meth:`should_stop`.

    Raises:
        ConfigError: entered outside the main thread (Python runs signal handlers there only).

    Example:
        >>> with zephon_dask.Preemption() as stop:  # doctest: +SKIP
        ...     for step in range(start, total):
        ...         train_one_step()
        ...         if stop.should_stop():  # every rank, every step: a collective under torchrun
        ...             state = zephon_dask.gather_state(pipeline)
        ...             if rank == 0:
        ...                 zephon_dask.save_state("ckpt/data.json", state)
        ...             break
        >>> sys.exit(stop.exit_code)  # doctest: +SKIP
    """

    def __init__(self, signals=STOP_SIGNALS, *, at_once: bool = False):
        self.signals = tuple(signal.Signals(s) for s in signals)
        self.at_once = bool(at_once)
        self.signum: int | None = None  # the first signal received
        self._first_at = 0.0  # monotonic time of the first signal
        self._previous: dict[int, Any] = {}  # signal -> the handler it had
        self._deferring = 0
        self._pending: int | None = None  # a signal held by deferred()
        self._before_raise: list = []  # called with the signal number before Preempted is raised

    def __enter__(self) -> Preemption:
        if threading.current_thread() is not threading.main_thread():
            raise ConfigError("Preemption() must be entered in the main thread: Python runs signal "
                              "handlers there only")
        for s in self.signals:
            self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, previous in self._previous.items():
            signal.signal(s, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()

    @property
    def requested(self) -> bool:
        """Whether this process received a stop signal (no collective)."""
        return self.signum is not None

    @property
    def exit_code(self) -> int:
        """``128 + signum`` once a signal arrived (130 SIGINT, 143 SIGTERM), else 0."""
        return 0 if self.signum is None else 128 + self.signum

    def should_stop(self) -> bool:
        """Whether any rank received a stop signal: under an initialised ``torch.distributed`` with
        several ranks a collective (every rank calls it at the same step), else :attr:`requested`."""
        return torch_dist.any_rank(self.requested)

    def deferred(self) -> _Deferred:
        """A block in which a signal waits until the block ends (then handled as usual)."""
        return _Deferred(self)

    def hold(self) -> None:
        """Hold signals until :meth:`release`, as inside :meth:`deferred` (holds nest)."""
        self._deferring += 1

    def release(self, handle: bool = True) -> None:
        """End a :meth:`hold`; once no hold is left, a held signal is handled as usual, or with
        ``handle=False`` only recorded (:attr:`requested`; nothing raised: an exception is already
        on its way, or the loop has ended)."""
        self._deferring = max(0, self._deferring - 1)
        if self._deferring or self._pending is None:
            return
        signum, self._pending = self._pending, None
        if handle:
            self._handle(signum, None)
        elif self.signum is None:
            self.signum, self._first_at = signum, time.monotonic()

    def before_raise(self, fn, add: bool = True) -> None:
        """Call ``fn(signum)`` just before :class:`Preempted` is raised (``add=False``: no longer).
        It runs in the signal handler, where the main thread was interrupted, never inside a
        :meth:`deferred` block."""
        if add:
            self._before_raise.append(fn)
        elif fn in self._before_raise:
            self._before_raise.remove(fn)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._deferring:
            self._pending = signum
            return
        if self.signum is None:
            self.signum, self._first_at = signum, time.monotonic()
            if self.at_once:
                self._raise(signum)
            _say(f"zephon_dask: {signal.Signals(signum).name} received: stopping at the end of this "
                 "step (send it again to stop at once)")
        elif time.monotonic() - self._first_at >= ECHO_S:
            self._raise(signum)

    def _raise(self, signum: int) -> None:
        self._deferring += 1  # a signal during the functions waits: they write the checkpoint
        try:
            for fn in list(self._before_raise):
                fn(signum)
        finally:
            self._deferring -= 1
            self._pending = None  # the same request, passed on while the checkpoint was written
        raise Preempted(signum)


class _Deferred:
    """The block of :meth:`Preemption.deferred`."""

    def __init__(self, owner: Preemption):
        self.owner = owner

    def __enter__(self) -> None:
        self.owner.hold()

    def __exit__(self, *exc) -> None:
        self.owner.release()


def _say(message: str) -> None:
    """One line on stderr from a signal handler: a raw write, never into a buffer the interrupted
    code may be writing to."""
    try:
        os.write(2, (message + "\n").encode())
    except OSError:
        pass
