"""One module per ``zephon-dask`` subcommand.

Each module defines ``HELP`` (one line), ``add_arguments(parser)`` and
``run(args) -> int`` (the exit status). Modules import only the standard
library at their top, so ``zephon-dask --help`` stays fast; heavy imports
happen inside ``run``.
"""

import argparse

COMMANDS = ("demo", "run", "verify", "prepare", "explain", "plan", "bench")


def _int(text: str, minimum: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
    return value


def positive_int(text: str) -> int:
    """An argparse ``type``: an integer >= 1 (else a one-line usage error, exit 2)."""
    return _int(text, 1, "a positive integer (1, 2, ...)")


def count(text: str) -> int:
    """An argparse ``type``: an integer >= 0."""
    return _int(text, 0, "a non-negative integer (0, 1, ...)")


def writable_file(path: str, option: str) -> None:
    """Raise an ``OSError`` (an :class:`~zephon_dask.errors.OutputPathError`, a one-line
    message) unless a file can be written at ``path``: checked before a run streams for
    minutes, not after. Creates the missing folders (as the write would) and opens an
    unnamed temporary file there, so nothing is left behind."""
    import os

    from ..errors import OutputIsADirectoryError

    target = os.path.abspath(path)
    if os.path.isdir(target):
        raise OutputIsADirectoryError(f"{option} {path!r} is a directory; give a file path")
    writable_dir(os.path.dirname(target), option, shown=path)


def writable_dir(path: str, option: str, shown: str | None = None) -> None:
    """Raise an ``OSError`` (an ``OutputPathError``) unless files can be written in the
    folder ``path`` (created if missing); the message names ``shown`` (default: ``path``)."""
    import os
    import tempfile

    from ..errors import OutputNotADirectoryError, OutputPermissionError

    target = os.path.abspath(path)
    if os.path.exists(target) and not os.path.isdir(target):
        raise OutputNotADirectoryError(f"{option} {path!r} is a file; give a folder")
    try:
        os.makedirs(target, exist_ok=True)
        with tempfile.TemporaryFile(dir=target):
            pass
    except OSError as exc:
        raise OutputPermissionError(f"{option} {(shown or path)!r} cannot be written: "
                                    f"{exc.strerror or exc}; choose a path in a writable folder") from None


def fail(command: str, exc: BaseException) -> int:
    """Print ``exc`` (and its notes) for ``zephon-dask COMMAND`` on stderr; the exit status 2."""
    import sys

    print(f"zephon-dask {command}: error: {exc}", *getattr(exc, "__notes__", ()), sep="\n", file=sys.stderr)
    return 2
