"""A training script exits promptly and quietly whatever it left open: a data error raised uncaught
(no ``with``, no ``close()``) on the default runner, or a short run that ends before its embedded
cluster is up. Real subprocesses; each exit gets a generous deadline (these used to hang for
minutes, or to wait for a cluster start), and every process a script started must end soon after
it. Exit times are measured by ``benchmarks/bench_exit.py``, not asserted here."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.helpers.pipelines import (
    build,
    child_pids,
    wait_for,
    wait_until_no_new_processes,
    write_corpus,
)
from zephon_dask.execution import runner as runner_mod

pytestmark = pytest.mark.timeout(300)
EXIT_DEADLINE = 120  # seconds: generous on a loaded machine; these scripts used to hang for good

WRONG_FIELD = """
import zephon_dask as z

ds = z.Dataset.from_jsonl("web", {data!r}, text_field="body", progress=False)
p = (z.Pipeline(z.MixtureWorkSource([ds], chunk_size=12, seed=1)).tokenize().pack(96).batch(3)
     .options(canonical_replicas=2, n_workers=2, head_start={head_start}))
for batch in p:
    pass
"""

USER_MAP_ERROR = """
import zephon_dask as z

def body(record):  # the user's bug: a field some records lack
    if len(record["text"]) % 4 == 0:
        with open({calls!r}, "a") as f:  # a probe of the test: one line per call that raises
            f.write(repr(record["text"][:60]) + "\\n")
        return {{"text": record["body"]}}
    return record

ds = z.Dataset.from_jsonl("web", {data!r}, progress=False)
p = (z.Pipeline(z.MixtureWorkSource([ds], chunk_size=12, seed=1)).map(body).tokenize().pack(96).batch(3)
     .options(canonical_replicas=2, n_workers=2, head_start={head_start}, retries=2))
for batch in p:
    pass
"""

SHORT_RUN = """
import sys
sys.path.insert(0, {root!r})
from pathlib import Path
from tests.helpers.pipelines import build

p = build(Path({corpus!r}), n_workers=2)
for i, batch in zip(range(4), p):
    pass
print("streamed", flush=True)
"""


def run_script(path: Path, tmpdir: Path | None = None) -> tuple[int, str, list[psutil.Process]]:
    """``(exit code, stdout and stderr, every process it started)``: run to its end (at most
    :data:`EXIT_DEADLINE` seconds), its descendants recorded while it runs; with ``tmpdir``, its
    temporary directory (``TMPDIR``)."""
    env = {**os.environ, "TMPDIR": str(tmpdir)} if tmpdir is not None else None
    proc = subprocess.Popen([sys.executable, str(path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)
    seen: dict[int, psutil.Process] = {}
    deadline = time.monotonic() + EXIT_DEADLINE
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                seen.update((c.pid, c) for c in psutil.Process(proc.pid).children(recursive=True))
            except psutil.NoSuchProcess:
                pass
            time.sleep(0.05)
        assert proc.poll() is not None, f"the script has not exited after {EXIT_DEADLINE} s"
    finally:
        proc.kill()
        out = proc.communicate(timeout=30)[0]
    return proc.returncode, out, list(seen.values())


def wait_until_gone(processes: list[psutil.Process], limit: float = 30.0) -> None:
    """Poll until each of ``processes`` has ended (a starting cluster's processes end with their
    parent); ``AssertionError`` naming those left after ``limit`` seconds."""

    def alive(p: psutil.Process) -> bool:
        try:
            return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.monotonic() + limit
    while (left := [p for p in processes if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"processes left {limit:g} s after the script exited: {left}"


@pytest.mark.slow
@pytest.mark.parametrize("head_start", [True, False])
def test_a_data_error_on_the_default_runner_fails_once_quietly_and_exits(corpus_dir, tmp_path, head_start):
    """A wrong ``text_field``: one traceback (ours, ending in the typed error), no "Compute Failed"
    from the workers (the error is not retried), and the script exits though nothing closed its
    pipeline."""
    script = tmp_path / "train.py"
    script.write_text(WRONG_FIELD.format(data=str(corpus_dir / "web"), head_start=head_start))
    code, out, started = run_script(script)
    assert code == 1, out[-3000:]
    assert out.count("Traceback (most recent call last)") == 1, out[-6000:]
    assert "Compute Failed" not in out and "retry" not in out.lower(), out[-6000:]
    error = out.strip().splitlines()
    assert any(line.startswith("zephon_dask.errors.MissingFieldError: dataset 'web'") and "'body'" in line
               for line in error[-4:]), out[-3000:]
    assert len(error) < 100, out  # was 183 lines with 18 "Compute Failed" blocks before the message
    wait_until_gone(started)


@pytest.mark.slow
def test_a_shard_deleted_under_a_cli_run_ends_it_once_with_exit_2(tmp_path):
    """``zephon-dask run`` on the embedded cluster, a shard deleted once batches flow: a file gone
    stays gone, so the task returns the ``DatasetNotFoundError`` instead of failing, Dask retries
    nothing and logs no "Compute Failed" (11 blocks, 85 lines before), and the run ends
    with one error naming the file and exit status 2 (data errors), not 1 (the stream ended)."""
    data = write_corpus(tmp_path / "web", n_files=8, docs=200)
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'[[datasets]]\nname = "web"\npath = "{data}"\n[source]\nchunk_size = 12\n'
                      'exhausted_policy = "repeat"\n[tokenize]\ntokenizer = "bytes"\n[pack]\nmax_length = 96\n'
                      '[batch]\nmicrobatch_size = 2\n[options]\ncanonical_replicas = 4\nn_workers = 2\n')
    ledger, victim = tmp_path / "ledger", data / "part-3.jsonl"
    with open(tmp_path / "out", "w") as out, open(tmp_path / "err", "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "zephon_dask.cli", "run", str(recipe), "--steps",
                                 "1000000", "--ledger", str(ledger)], stdout=out, stderr=err)
    try:
        streaming = wait_for(lambda: proc.poll() is not None or (
            (ledger / "rank-0.jsonl").exists() and (ledger / "rank-0.jsonl").stat().st_size > 0), EXIT_DEADLINE, every=0.1)
        assert streaming and proc.poll() is None, (tmp_path / "err").read_text()[-3000:]
        started = psutil.Process(proc.pid).children(recursive=True)
        victim.unlink()
        code = proc.wait(timeout=EXIT_DEADLINE)  # the stream repeats: it reads part-3 again soon
    finally:
        proc.kill()
        proc.wait(timeout=30)
    errors = (tmp_path / "err").read_text()
    assert code == 2, errors[-3000:]
    assert "Compute Failed" not in errors and "Traceback" not in errors, errors[-6000:]
    assert len(errors.splitlines()) < 40, errors
    assert "zephon-dask run: error: dataset 'web': file" in errors and "part-3.jsonl" in errors, errors
    wait_until_gone(started)


@pytest.mark.slow
@pytest.mark.parametrize("head_start", [True, False])
def test_an_error_in_the_users_map_is_raised_once_not_retried(corpus_dir, tmp_path, head_start):
    """A ``map`` raising ``KeyError`` on some records: a window is a pure function, so the same
    error would come back on every retry. Each failing record is tried once (``retries=2`` is
    not spent on it), no "Compute Failed" from the workers, one traceback ending in the
    user's error and the record's place."""
    script, calls = tmp_path / "train.py", tmp_path / "calls.txt"
    script.write_text(USER_MAP_ERROR.format(data=str(corpus_dir / "web"), calls=str(calls), head_start=head_start))
    code, out, started = run_script(script)
    assert code == 1, out[-3000:]
    tried = calls.read_text().splitlines()
    assert tried and len(tried) == len(set(tried)), tried  # was each 3 times: the try and 2 retries
    assert out.count("Traceback (most recent call last)") == 1, out[-6000:]
    assert "Compute Failed" not in out, out[-6000:]
    error = out.strip().splitlines()
    assert "KeyError: 'body'" in error[-4:] and any("map failed on dataset 'web'" in line for line in error[-4:]), out
    assert len(error) < 100, out
    wait_until_gone(started)


@pytest.mark.slow
def test_a_short_run_that_never_closes_exits_without_waiting_for_its_cluster(corpus_dir, tmp_path):
    """Four batches (from the head start, while the embedded cluster starts) and the end of the
    script, with no ``close()``: it exits, and the cluster's processes end with it."""
    script = tmp_path / "train.py"
    script.write_text(SHORT_RUN.format(root=str(Path(__file__).resolve().parents[2]), corpus=str(corpus_dir)))
    tmp = tmp_path / "tmp"  # the script's own: other runs' hosts may come and go in the shared one
    tmp.mkdir()
    code, out, started = run_script(script, tmp)
    assert code == 0 and "streamed" in out, out[-3000:]
    assert "Traceback" not in out, out[-6000:]
    wait_until_gone(started)
    assert not list(tmp.glob("zephon-dask-host-*"))  # the cluster's host left no socket behind


def test_close_returns_while_the_cluster_starts_and_the_start_is_undone(corpus_dir, monkeypatch):
    """``close()`` does not wait for a cluster start in progress; the start, once done, closes
    what it started (no process is left)."""
    real = runner_mod.local_cluster
    closed = threading.Event()

    def slow(*args, **kwargs):  # the start ends only after close() has returned
        closed.wait(60)
        return real(*args, **kwargs)

    monkeypatch.setattr(runner_mod, "local_cluster", slow)
    before = child_pids()
    p = build(corpus_dir, n_workers=1)
    try:
        next(iter(p))  # from the head start
        runner = p.session.runner()
        assert runner.starting
        assert "starting" in str(p.explain()) and "starting" in repr(p)  # inspection says so, never waits
        p.close()
        assert runner.starting  # close() did not wait for it
    finally:
        closed.set()
    wait_until_no_new_processes(before, limit=60)


def test_a_pipeline_closed_before_its_cluster_was_needed_starts_none(corpus_dir, monkeypatch):
    """The cluster's start waits for the first window computed here; a pipeline closed before
    that starts no cluster at all (and its close does not wait for the start's bound)."""
    started = []
    monkeypatch.setattr(runner_mod, "local_cluster", lambda *args, **kwargs: started.append(args))
    p = build(corpus_dir, n_workers=1)
    runner = p.session.runner()  # nothing iterated: the start waits
    p.close()
    wait_for(lambda: not runner.starting, 30, every=0.05)
    assert not runner.starting and started == []
    assert "closed" in runner.describe()
