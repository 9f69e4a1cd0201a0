"""One module per ``zephon-dask`` subcommand.

Each module defines ``HELP`` (one line), ``add_arguments(parser)`` and
``run(args) -> int`` (the exit status). Modules import only the standard
library at their top, so ``zephon-dask --help`` stays fast; heavy imports
happen inside ``run``.
"""

COMMANDS = ("demo", "run", "verify", "prepare", "explain", "plan", "bench")


def fail(command: str, exc: BaseException) -> int:
    """Print ``exc`` (and its notes) for ``zephon-dask COMMAND`` on stderr; the exit status 2."""
    import sys

    print(f"zephon-dask {command}: error: {exc}", *getattr(exc, "__notes__", ()), sep="\n", file=sys.stderr)
    return 2
