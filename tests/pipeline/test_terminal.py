"""At home in a notebook and a terminal: reprs, the session's Dask client, the logger, a quiet import."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import zephon_dask as z
from zephon_dask.cli import main
from zephon_dask.errors import ConfigError, NotFoundError, ZephonError
from zephon_dask.inspect import plan_table, state_html, window_graph

DOCS = [f"doc {i}: " + "lorem ipsum dolor sit amet " * (1 + i % 5) for i in range(60)]


def small(map_fn=None, **options) -> z.Pipeline:
    web = z.Dataset.from_records("web", DOCS[:40])
    code = z.Dataset.from_records("code", DOCS[40:])
    source = z.MixtureWorkSource([web, code], {"web": 2, "code": 1}, chunk_size=6, seed=3)
    pipeline = z.Pipeline(source)
    if map_fn is not None:
        pipeline = pipeline.map(map_fn)
    return (pipeline.tokenize().pack(64).batch(2, labels=True)
            .options(canonical_replicas=2, flush_every_k_chunks=2, **options))


def test_pipeline_repr_is_one_screen_from_the_same_description_as_html():
    p = small(runner="synchronous")
    text = repr(p)
    assert "object at 0x" not in text
    lines = text.splitlines()
    assert len(lines) <= 24 and max(map(len, lines)) < 400
    for part in (p.fingerprint()[:16], "web (records, 1 shards, 40 samples", "code (records",
                 "tokenize(", "pack(", "canonical_replicas=2", "dp_degree=1, dp_group_id=0, lanes [0, 1]",
                 "synchronous"):
        assert part in text, part
    html = p._repr_html_()
    for part in (p.fingerprint()[:16], "40 samples", "canonical_replicas=2"):
        assert part in html


def test_pipeline_repr_never_raises_on_a_bad_identity():
    text = repr(small(runner="synchronous", dp_degree=2, dp_group_id=5))
    assert "identity" in text and "invalid" in text


def test_inspection_values_repr_as_their_text():
    p = small(runner="synchronous")
    for value in (p.explain(), p.preview(1), plan_table(p, (1, 2)), p.stats(), window_graph(p, 0, 0)):
        text = repr(value)
        assert "Section(" not in text and "PlanEntry(" not in text and "PreviewRow(" not in text
        assert text.strip(), type(value).__name__
    assert repr(p.explain()) == str(p.explain())


def test_explain_section_by_short_title_and_typed_error():
    e = small(runner="synchronous").explain()
    assert e.section("execution").title.startswith("execution")
    with pytest.raises(NotFoundError) as info:
        e.section("nope")
    assert isinstance(info.value, KeyError) and isinstance(info.value, ZephonError)
    assert "'datasets'" in str(info.value) and "'execution'" in str(info.value)


def test_state_html_takes_a_saved_file(tmp_path):
    p = small(runner="synchronous")
    with p:
        for _ in zip(range(3), p):
            pass
        path = z.save_state(tmp_path / "ck.json", p.state_dict())
    from_file = state_html(json.loads(path.read_text()))
    assert from_file == state_html(z.load_state(path))
    assert "batches_delivered" in from_file and ">0<" in from_file


def test_import_emits_no_warning():
    code = "import warnings; warnings.simplefilter('error'); import zephon_dask, zephon_dask.cli"
    out = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stderr == "", out.stderr


HEAVY = ("dask", "distributed", "torch", "numpy")
# ``-X importtime`` misses modules loaded by importlib.import_module (how cli.py loads the
# command modules), so the child also lists sys.modules at exit, after ``--help`` exited.
HELP_MODULES = """
import atexit, runpy, sys
atexit.register(lambda: print(*("module: " + m for m in sorted(sys.modules)), sep="\\n", file=sys.stderr))
sys.argv = ["zephon-dask", "--help"]
runpy.run_module("zephon_dask.cli", run_name="__main__", alter_sys=True)
"""


def test_cli_help_imports_nothing_heavy():
    """``zephon-dask --help`` (the console script runs ``zephon_dask.cli:main``) imports only the
    standard library and the light command modules: heavy imports wait for a command's ``run``.
    (What it adds to startup: ``python benchmarks/bench_exit.py --cases help``.)"""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", HELP_MODULES], capture_output=True,
                          text=True, timeout=60, cwd=root, env=env)
    assert done.returncode == 0 and "usage: zephon-dask" in done.stdout, done.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()
                if line.startswith("import time:")}
    imported |= {line.removeprefix("module: ") for line in done.stderr.splitlines()
                 if line.startswith("module: ")}
    assert "zephon_dask.commands.run" in imported  # the parser really loaded the command modules
    heavy = sorted({m.split(".")[0] for m in imported} & set(HEAVY))
    assert not heavy, f"--help imported {heavy}"


def test_cli_version(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"zephon-dask {z.__version__}"


def test_the_sessions_dask_client_is_used(caplog):
    from distributed import Client, LocalCluster

    expected = [b["tokens"].tobytes() for b in small(runner="synchronous")]
    with LocalCluster(n_workers=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster) as client, caplog.at_level(logging.INFO, logger="zephon_dask"):
        with small() as p:
            got = [b["tokens"].tobytes() for b in p]
            where = p.explain().section("execution").pairs[0][1]
        assert client.scheduler.address in where  # the session's scheduler, not a new cluster
        assert "session's Dask client" in caplog.text
        with small(session_client=False, runner="threads") as p:  # an explicit runner wins
            assert [b["tokens"].tobytes() for b in p] == expected
    assert got == expected


def test_options_suggest_the_closest_name_and_check_booleans():
    with pytest.raises(ConfigError, match="did you mean 'prefetch_windows'"):
        small().options(prefetch_window=4)
    with pytest.raises(ConfigError, match="fuse='yes' must be True or False"):
        small().options(fuse="yes")


def test_set_log_level():
    with pytest.raises(ConfigError, match="log level 'loud' is unknown"):
        z.set_log_level("loud")
    logger = logging.getLogger("zephon_dask")
    before = list(logger.handlers)
    try:
        z.set_log_level("info")
        z.set_log_level("debug")
        ours = [h for h in logger.handlers if h not in before]
        assert len(ours) <= 1 and logger.level == logging.DEBUG
    finally:
        for h in [h for h in logger.handlers if h not in before]:
            logger.removeHandler(h)
        logger.setLevel(logging.NOTSET)


def _slow(record):
    import time

    time.sleep(0.02)
    return record


def test_the_first_batch_is_logged_and_a_slow_one_shows_progress(caplog, monkeypatch):
    from zephon_dask.consumer import waiting

    bars = []

    class Bar:
        def __init__(self, **kwargs):
            self.kwargs, self.n, self.total = kwargs, 0, kwargs["total"]
            bars.append(self)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def refresh(self):
            pass

    monkeypatch.setattr(waiting, "progress_bar", Bar)
    monkeypatch.setattr(waiting, "SHOW_AFTER", 0.0)
    monkeypatch.setattr(waiting, "TICK", 0.01)
    with caplog.at_level(logging.INFO, logger="zephon_dask"), \
            small(_slow, runner="threads", n_workers=2) as p:
        first = next(iter(p))
    assert first is not None
    logged = re.search(r"(\d+) window\(s\) submitted for the first batch \(lanes \[0, 1\]\): ([\d,]+) documents",
                       caplog.text)
    assert logged is not None and "first batch after" in caplog.text
    windows, documents = int(logged[1]), int(logged[2].replace(",", ""))
    # the bar counts the documents of the windows the log names, all of them (none taken out yet)
    assert len(bars) == 1 and bars[0].kwargs["desc"] == f"first batch: {windows} windows"
    assert bars[0].kwargs["unit"] == "doc" and bars[0].total == documents <= windows * 2 * 6
    # it moved: the first batch's window (2 chunks of 6 documents) counts before the bar goes
    assert 2 * 6 <= bars[0].n <= bars[0].total


def test_debug_logs_each_window_with_its_worker_time_and_bytes(caplog):
    with caplog.at_level(logging.DEBUG, logger="zephon_dask"), small(runner="threads", n_workers=2) as p:
        batches = list(p)
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG and "computed on" in r.getMessage()]
    windows = {(lane, w) for lane in range(2) for w in range(p.spec.num_windows(lane))}
    got = {(int(m[1]), int(m[2])) for m in (re.match(r"lane (\d+) window (\d+): computed on pid \d+ \(zephon-window"
                                                     r"\S*\) in [\d.]+ s, [\d,]+ bytes, \d+ rows", line)
                                            for line in lines) if m}
    assert got == windows and len(lines) == len(windows) and batches  # one line per window, none per batch


RECIPE = __import__("pathlib").Path(__file__).resolve().parents[2] / "examples" / "recipe.toml"


@pytest.mark.parametrize("argv", [
    ["run", str(RECIPE), "--steps", "-3"],
    ["run", str(RECIPE), "--steps", "two"],
    ["run", str(RECIPE), "--steps", "2", "--dp-group-id", "-1"],
    ["explain", str(RECIPE), "--dp-degree", "0"],
    ["prepare", str(RECIPE), "--out", "x", "--workers", "0"],
])
def test_cli_argument_errors_are_one_line_and_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and "error: argument" in err


def test_cli_checks_output_paths_before_streaming(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    for argv in (["--checkpoint", str(blocker / "ck.json")], ["--checkpoint", str(tmp_path)],
                 ["--ledger", str(blocker)]):
        assert main(["run", str(RECIPE), "--steps", "2", *argv]) == 2
        out = capsys.readouterr()
        assert "global step" not in out.out  # refused before the recipe's pipeline was built
        assert len(out.err.strip().splitlines()) == 1 and argv[0] in out.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # nothing left behind


def test_output_path_errors_are_typed(tmp_path):
    from zephon_dask.commands import writable_dir, writable_file
    from zephon_dask.errors import (
        OutputIsADirectoryError,
        OutputNotADirectoryError,
        OutputPathError,
        ZephonError,
    )

    blocker = tmp_path / "file"
    blocker.write_text("")
    for call, cls, builtin in ((lambda: writable_file(str(tmp_path), "--checkpoint"),
                                OutputIsADirectoryError, IsADirectoryError),
                               (lambda: writable_dir(str(blocker), "--ledger"),
                                OutputNotADirectoryError, NotADirectoryError)):
        with pytest.raises(cls) as info:
            call()
        assert isinstance(info.value, builtin) and isinstance(info.value, OutputPathError)
        assert isinstance(info.value, ZephonError) and str(info.value).startswith("--")
