"""The ``zephon-dask`` command line."""

from __future__ import annotations

import argparse


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="zephon-dask",
        description="Deterministic, elastically resumable LLM training batches computed on Dask.",
    )
    sub = parser.add_subparsers(dest="command")
    demo = sub.add_parser("demo", help="stream a stdlib corpus on an embedded LocalCluster")
    demo.add_argument("--workdir", default=".zephon-demo", help="where the corpus is cached")
    demo.add_argument("--steps", type=int, default=40, help="global steps to stream")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from .demo import run

        return run(args.workdir, args.steps)
    parser.print_help()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
