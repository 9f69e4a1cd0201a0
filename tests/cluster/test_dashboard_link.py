"""``zephon-dask run`` prints the Dask dashboard's link once, on stderr, when its cluster starts, at the
default log level; a library user's process stays silent."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXE = Path(sys.executable).parent / "zephon-dask"

pytestmark = pytest.mark.slow


def test_run_prints_the_dashboard_link_once_at_the_default_log_level(tmp_path):
    recipe = (ROOT / "examples" / "recipe.toml").read_text().replace('path = "data/', f'path = "{ROOT}/examples/data/')
    (tmp_path / "recipe.toml").write_text(recipe + "head_start = false  # the cluster starts before any window\n")
    env = {k: v for k, v in os.environ.items() if k != "ZEPHON_DASK_LOG"}
    done = subprocess.run([str(EXE), "run", str(tmp_path / "recipe.toml"), "--steps", "2"],
                          capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count("zephon_dask: Dask dashboard at http://127.0.0.1:") == 1, done.stderr[-3000:]
    assert "INFO" not in done.stderr  # only the link: the other info records stay hidden


def test_the_link_printer_keeps_the_warnings_and_goes_away():
    code = ("import logging, zephon_dask.log as l\n"
            "with l.dashboard_link_shown():\n"
            "    l.logger.info('hidden')\n"
            "    l.logger.info('started', extra={'dashboard': 'http://x:1/status'})\n"
            "    l.logger.info('again', extra={'dashboard': 'http://x:1/status'})\n"
            "    l.logger.warning('a warning')\n"
            "l.logger.info('after', extra={'dashboard': 'http://x:1/status'})\n"
            "l.logger.warning('later warning')\n"
            "print(l.logger.level, len(l.logger.handlers))\n")
    env = {k: v for k, v in os.environ.items() if k != "ZEPHON_DASK_LOG"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == ["zephon_dask: Dask dashboard at http://x:1/status", "a warning",
                                        "later warning"]
    assert done.stdout.split() == ["0", "0"]
