"""The ``zephon_dask`` logger. Holds the logging configuration of the package's own logger.

Silent by default apart from warnings (Python's last-resort handler prints
those). :func:`set_log_level` (or ``ZEPHON_DASK_LOG=info`` in the environment)
turns it up: cluster start and dashboard, windows computed before the first
batch, resume points and windows recomputed after a lost worker.
"""

from __future__ import annotations

import logging
import os

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


if os.environ.get(ENV):
    try:
        set_log_level(os.environ[ENV])
    except ConfigError as exc:
        raise ConfigError(f"the environment variable {ENV}={os.environ[ENV]!r}: {exc}; unset it for "
                          "the default (warnings only)") from None
