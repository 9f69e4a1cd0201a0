"""What the docs show, run as written: docs/quickstart.md's determinism example prints the hash it shows."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def blocks(page: str, lang: str) -> list[str]:
    """The fenced ``lang`` blocks of ``docs/<page>``, in order."""
    return re.findall(rf"```{lang}\n(.*?)```", (ROOT / "docs" / page).read_text(), re.S)


def test_quickstart_prints_the_same_hash_twice_as_shown(tmp_path):
    python = blocks("quickstart.md", "python")
    first = next(b for b in python if b.startswith("import zephon_dask as z\n\nprose = "))
    same = next(b for b in python if "from first import pipeline" in b)
    (tmp_path / "first.py").write_text(first)
    (tmp_path / "same.py").write_text(same)
    shown = next(b for b in blocks("quickstart.md", "text") if re.fullmatch(r"([0-9a-f]{64}\n){2}", b))
    for _ in range(2):  # two processes: the same bytes on every run
        run = subprocess.run([sys.executable, str(tmp_path / "same.py")], cwd=ROOT, capture_output=True,
                             text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        assert run.stdout == shown


def test_the_concepts_picture_shows_the_example_pipelines_lanes_and_windows():
    import zephon_dask as z

    picture = next(b for b in blocks("concepts.md", "text") if "Lanes and windows" in b)
    data = ROOT / "examples" / "data"
    source = z.MixtureWorkSource([z.Dataset.from_jsonl("prose", data / "prose.jsonl", progress=False),
                                  z.Dataset.from_jsonl("code", data / "code.jsonl", progress=False)],
                                 {"prose": 0.6, "code": 0.4}, chunk_size=8, seed=1234, stop_after_passes=20)
    lanes = re.findall(r"^   lane (\d) ((?:\[[\d ]+\] ?)+)", picture, re.M)
    assert [int(lane) for lane, _ in lanes] == [0, 1, 2, 3]
    for lane, windows in lanes:
        shown = [[int(g) for g in w.split()] for w in re.findall(r"\[([\d ]+)\]", windows)]
        chunks = list(source.lane_chunks(int(lane), 4)[:6])
        assert shown == [chunks[0:2], chunks[2:4], chunks[4:6]], lane


def test_the_ensure_mixture_example_prints_the_shares_shown(capsys):
    code = next(b for b in blocks("operators.md", "python") if "ensure_mixture(strict=True)" in b)
    shown = next(b for b in blocks("operators.md", "text") if b.startswith("share of b:"))
    exec(compile(code, "operators.md", "exec"), {})
    assert capsys.readouterr().out == shown
