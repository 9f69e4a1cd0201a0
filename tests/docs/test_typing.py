"""The package type-checks: mypy over ``zephon_dask`` with the settings in pyproject.toml
(``[tool.mypy]``, also run by ``make lint``)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_mypy_is_clean():
    """No error; the cache (``.mypy_cache``, ignored by git) makes a repeated run take seconds."""
    mypy = shutil.which("mypy", path=str(Path(sys.executable).parent))
    assert mypy is not None, "mypy is a dev dependency: pip install -e '.[dev]'"
    out = subprocess.run([mypy], cwd=ROOT, capture_output=True, text=True, timeout=540)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    assert out.stdout.startswith("Success: no issues found"), out.stdout[-2000:]
