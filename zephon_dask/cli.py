"""The ``zephon-dask`` command line: dispatches to :mod:`zephon_dask.commands`."""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings

from . import __version__
from .commands import COMMANDS


class Parser(argparse.ArgumentParser):
    """Argument errors: one line on stderr and exit status 2 (argparse's own adds the usage)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def main(argv=None) -> int:
    parser = Parser(
        prog="zephon-dask",
        description="Deterministic, elastically resumable LLM training batches computed on Dask.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command")
    modules = {}
    for name in COMMANDS:
        module = importlib.import_module(f"zephon_dask.commands.{name}")
        modules[name] = module
        module.add_arguments(sub.add_parser(name, help=module.HELP, description=module.HELP))
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    with warnings.catch_warnings():  # restores the caller's display when main() is called in-process
        warnings.showwarning = _one_line(args.command)
        return modules[args.command].run(args)


def _one_line(command: str):
    """A ``warnings.showwarning`` printing ``zephon-dask COMMAND: warning: ...`` on one line: the
    CLI's messages never carry a source line."""
    def show(message, category, filename, lineno, file=None, line=None):
        print(f"zephon-dask {command}: warning: {message}", file=sys.stderr if file is None else file)
    return show


if __name__ == "__main__":
    raise SystemExit(main())
