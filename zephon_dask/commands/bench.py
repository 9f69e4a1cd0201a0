"""``zephon-dask bench [--quick]``: run the benchmark suite of a source checkout.

The benchmarks (``benchmarks/run_all.py``) ship with the source tree, not the
installed package; this command finds them next to the package (an editable
install) or in the current directory.
"""

import subprocess
import sys
from pathlib import Path

HELP = "run benchmarks/run_all.py of a source checkout (--quick for a short run)"
SCRIPT = Path("benchmarks") / "run_all.py"


def find_script() -> Path | None:
    """``benchmarks/run_all.py`` beside the package's source tree, else under the current directory."""
    for root in (Path(__file__).resolve().parents[2], Path.cwd()):
        if (root / SCRIPT).is_file():
            return root / SCRIPT
    return None


def add_arguments(parser) -> None:
    parser.add_argument("--quick", action="store_true", help="a short run of every benchmark")


def run(args) -> int:
    script = find_script()
    if script is None:
        print("zephon-dask bench: error: benchmarks/run_all.py not found. The benchmarks ship with the "
              "source tree: clone the repository, then run `make bench` (or `zephon-dask bench`) in it",
              file=sys.stderr)
        return 2
    cmd = [sys.executable, str(script), *(["--quick"] if args.quick else [])]
    return subprocess.run(cmd, cwd=script.parent.parent).returncode
