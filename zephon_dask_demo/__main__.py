"""``python -m zephon_dask_demo [options]``: the same as ``zephon-dask demo [options]``."""

import sys

from zephon_dask.cli import main

if __name__ == "__main__":
    sys.exit(main(["demo", *sys.argv[1:]]))
