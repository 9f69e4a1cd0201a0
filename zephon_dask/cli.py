"""The ``zephon-dask`` command line: dispatches to :mod:`zephon_dask.commands`."""

from __future__ import annotations

import argparse
import importlib

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
    return modules[args.command].run(args)


if __name__ == "__main__":
    raise SystemExit(main())
