"""The ``zephon_dask`` logger. Holds the logging configuration of the package's own logger.

Silent by default apart from warnings (Python's last-resort handler prints
those). :func:`set_log_level` (or ``ZEPHON_DASK_LOG=info`` in the environment)
turns it up: cluster start and dashboard, windows computed before the first
batch, resume points and windows recomputed after a lost worker.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from .errors import ConfigError

logger = logging.getLogger("zephon_dask")
ENV = "ZEPHON_DASK_LOG"
_FORMAT = "%(asctime)s zephon_dask %(levelname)s: %(message)s"


def set_log_level(level: int | str = "INFO") -> None:
    """Show ``zephon_dask`` log records at ``level`` and above on stderr.

    Args:
        level: a :mod:`logging` level or its name (``"DEBUG"``, ``"INFO"``,
            ``"WARNING"``, ...), case-insensitive.

    Example:
        >>> import zephon_dask as z
        >>> z.set_log_level("info")  # doctest: +SKIP
    """
    if isinstance(level, str):
        name = level.upper()
        if name not in logging.getLevelNamesMapping():
            known = ", ".join(sorted(n for n in logging.getLevelNamesMapping() if n != "NOTSET"))
            raise ConfigError(f"log level {level!r} is unknown; choose one of {known}")
        level = logging.getLevelNamesMapping()[name]
    if not any(getattr(h, "_zephon", False) for h in logger.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(_FORMAT, "%H:%M:%S"))
        handler._zephon = True  # type: ignore[attr-defined]  # ours: added once, whatever the level
        logger.addHandler(handler)
    logger.setLevel(level)


class _DashboardLine(logging.Handler):
    """Prints ``dashboard: <link>`` once, when a runner starts or reaches a cluster (a record with a
    ``dashboard`` attribute), and the warnings Python's last-resort handler would have printed had
    this handler not been there."""

    _zephon_dashboard = True

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.shown = False

    def emit(self, record: logging.LogRecord) -> None:
        link = getattr(record, "dashboard", None)
        ours = any(getattr(h, "_zephon", False) for h in logger.handlers)  # set_log_level's shows it all
        if link and not self.shown and not ours:
            self.shown = True
            print(f"zephon_dask: Dask dashboard at {link}", file=sys.stderr, flush=True)
        elif record.levelno >= logging.WARNING and not _other_handlers(self):
            print(record.getMessage(), file=sys.stderr, flush=True)


def _other_handlers(me: logging.Handler) -> bool:
    """Whether a handler besides ``me`` would see the package's records (else Python's
    last-resort handler would have printed its warnings)."""
    log: logging.Logger | None = logger
    while log is not None:
        if any(h is not me for h in log.handlers):
            return True
        log = log.parent if log.propagate else None
    return False


@contextmanager
def dashboard_link_shown() -> Iterator[None]:
    """While inside: print the Dask dashboard's link once on stderr when the cluster starts (or is
    reached), at the default log level; for ``zephon-dask run`` and the demo."""
    handler, level = _DashboardLine(), logger.level
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)  # the start's record reaches the handler; it prints warnings only
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


if os.environ.get(ENV):
    try:
        set_log_level(os.environ[ENV])
    except ConfigError as exc:
        raise ConfigError(f"the environment variable {ENV}={os.environ[ENV]!r}: {exc}; unset it for "
                          "the default (warnings only)") from None
