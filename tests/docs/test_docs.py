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


def run_page(page: str, tmp_path) -> str:
    """Every python block of ``docs/<page>``, in order, as one script run from the repository root."""
    script = tmp_path / f"{Path(page).stem}.py"
    script.write_text("\n".join(blocks(page, "python")))
    run = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    return run.stdout


def test_every_python_block_of_concepts_runs_as_written_and_prints_what_it_shows(tmp_path):
    out = run_page("concepts.md", tmp_path)
    lanes = next(b for b in blocks("concepts.md", "text") if b.startswith("lane 0:"))
    schedule = next(b for b in blocks("concepts.md", "text") if b.startswith("mixture schedule:"))
    assert lanes in out and schedule in out
    assert "(Fraction(8741, 50), Fraction(1151, 10))" in out


def test_every_python_block_of_the_own_data_guide_runs_as_written(tmp_path):
    out = run_page("own-data.md", tmp_path)
    assert "('content', 'headline')" in out and "(2, 256)" in out
    assert out.count("content") >= 2 and "news" in out and "wiki" in out


def test_performance_is_a_summary_with_commands_and_its_logs_lie_beside_the_benchmarks():
    page = (ROOT / "docs" / "performance.md").read_text()
    assert len(page.splitlines()) < 700, "keep measurement logs in benchmarks/RESULTS.md"
    scripts = set(re.findall(r"python benchmarks/(\w+\.py)", page))
    assert scripts and all((ROOT / "benchmarks" / s).exists() for s in scripts), scripts
    results = (ROOT / "benchmarks" / "RESULTS.md").read_text()
    for anchor in set(re.findall(r"\(\.\./benchmarks/RESULTS\.md#([\w-]+)\)", page)):
        assert any(re.sub(r"[^\w\- ]", "", h.lstrip("#").strip().lower()).replace(" ", "-") == anchor
                   for h in results.splitlines() if h.startswith("#")), anchor


def test_operators_add_op_example_validates_as_shown(tmp_path):
    block = next(b for b in blocks("operators.md", "python") if ".add_op(Lowercase())" in b)
    (tmp_path / "lowercase.py").write_text(block)
    run = subprocess.run([sys.executable, str(tmp_path / "lowercase.py")], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert re.fullmatch(r"lowercase \(record operator add_op\(Lowercase\)\): \d+ checks passed on chunks \[.*\]\n",
                        run.stdout)


def test_the_ensure_mixture_example_prints_the_shares_shown(capsys):
    code = next(b for b in blocks("operators.md", "python") if "ensure_mixture(strict=True)" in b)
    shown = next(b for b in blocks("operators.md", "text") if b.startswith("share of b:"))
    exec(compile(code, "operators.md", "exec"), {})
    assert capsys.readouterr().out == shown


def test_every_python_block_of_curriculum_runs_as_written(tmp_path):
    run_page("curriculum.md", tmp_path)
