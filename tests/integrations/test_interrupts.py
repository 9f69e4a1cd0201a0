"""Interrupts as clusters send them: SIGINT, SIGTERM and SIGKILL at seeded random points of a real
``zephon-dask run`` and of a real 2-rank ``torchrun`` training loop, each resumed from its checkpoint
(on another DP degree) and compared, step by step through the ledger, with the uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

import zephon_dask as z
from tests.helpers.pipelines import build
from zephon_dask.cli import main as cli
from zephon_dask.preemption import ECHO_S

ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).resolve().parents[1] / "jobs" / "torchrun_job.py"
DEADLINE = 180.0  # seconds any one wait here may take before the test fails instead of hanging


def wait_for(predicate, what: str, deadline: float = DEADLINE):
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {deadline:g} s waiting for {what}")


def ledger_lines(folder: Path) -> int:
    return sum(p.read_bytes().count(b"\n") for p in folder.glob("rank-*.jsonl"))


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def gone(processes: list[psutil.Process]) -> bool:
    return not [p for p in processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


@pytest.fixture(scope="module")
def long_recipe(tmp_path_factory):
    """The example recipe, its stream long enough (2,000 passes) to be interrupted anywhere."""
    text = (ROOT / "examples" / "recipe.toml").read_text()
    text = text.replace('path = "data/', f'path = "{ROOT}/examples/data/')
    text = text.replace("stop_after_passes = 20", "stop_after_passes = 2000")
    path = tmp_path_factory.mktemp("recipe") / "recipe.toml"
    path.write_text(text)
    return path


# -- the Preemption object ---------------------------------------------------------------------


def test_the_first_signal_is_a_request_and_a_later_one_stops_at_once():
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}  # SIGINT: ignored in a background job
    with z.Preemption() as stop:
        assert not stop.should_stop() and stop.exit_code == 0
        signal.raise_signal(signal.SIGTERM)
        assert stop.requested and stop.should_stop() and stop.exit_code == 143
        signal.raise_signal(signal.SIGINT)  # within ECHO_S: the same request, passed on by a launcher
        assert stop.signum == signal.SIGTERM
        stop._first_at -= ECHO_S  # a second signal sent later
        with pytest.raises(z.Preempted) as info:
            signal.raise_signal(signal.SIGINT)
    assert info.value.exit_code == 130 and isinstance(info.value, KeyboardInterrupt)
    assert {s: signal.getsignal(s) for s in before} == before  # handlers restored


def test_at_once_raises_where_the_process_is_and_deferred_blocks_wait():
    with z.Preemption(at_once=True) as stop:
        with pytest.raises(z.Preempted) as info, stop.deferred():
            signal.raise_signal(signal.SIGTERM)
            held = stop.signum  # not handled yet: the block is not done
        assert held is None and info.value.signum == signal.SIGTERM


def test_before_raise_writes_the_checkpoint_outside_held_blocks_and_release_can_only_record():
    """An at-once stop runs its ``before_raise`` functions, then raises, never inside a hold (an
    optimizer step); a signal while they run is the same request. ``release(handle=False)`` (the
    loop has ended, or an exception is on its way) records a held signal without raising."""
    saved = []
    with z.Preemption(at_once=True) as stop:
        stop.before_raise(lambda signum: (saved.append(signum), signal.raise_signal(signal.SIGINT)))
        stop.hold()
        signal.raise_signal(signal.SIGTERM)
        assert saved == [] and not stop.requested  # held: the weights are changing
        with pytest.raises(z.Preempted) as info:
            stop.release()
        assert saved == [signal.SIGTERM] and info.value.signum == signal.SIGTERM
    with z.Preemption(at_once=True) as stop:
        stop.before_raise(saved.append)
        stop.before_raise(saved.append, add=False)
        stop.hold()
        signal.raise_signal(signal.SIGTERM)
        stop.release(handle=False)
        assert stop.exit_code == 143 and saved == [signal.SIGTERM]


def test_preemption_needs_the_main_thread():
    errors = []
    thread = threading.Thread(target=lambda: errors.append(_enter_off_main()))
    thread.start()
    thread.join(10)
    assert isinstance(errors[0], z.ConfigError) and "main thread" in str(errors[0])


def _enter_off_main():
    try:
        with z.Preemption():
            return None
    except z.ConfigError as exc:
        return exc


# -- zephon-dask run -----------------------------------------------------------------------------


@pytest.mark.parametrize("sig, group, runner, seed", [
    (signal.SIGINT, True, None, 1),          # Ctrl-C in a terminal: the whole process group, embedded cluster
    (signal.SIGTERM, False, "threads", 2),   # Kubernetes: the training process alone
    (signal.SIGKILL, False, "threads", 3),   # past the grace period: the last periodic checkpoint
])
def test_an_interrupted_run_resumes_exactly_on_another_degree(long_recipe, tmp_path, sig, group, runner, seed):
    at = int(np.random.default_rng(seed).integers(8, 160))  # batches delivered before the signal
    ckpt, ledger, out, err = tmp_path / "ckpt.json", tmp_path / "split", tmp_path / "out", tmp_path / "err"
    cmd = [sys.executable, "-m", "zephon_dask.cli", "run", str(long_recipe), "--steps", "1000",
           "--checkpoint", str(ckpt), "--checkpoint-every", "5", "--ledger", str(ledger)]
    with open(out, "w") as stdout, open(err, "w") as stderr:
        proc = subprocess.Popen(cmd + (["--runner", runner] if runner else []), stdout=stdout, stderr=stderr,
                                start_new_session=True)
    try:
        wait_for(lambda: ledger_lines(ledger) >= at or proc.poll() is not None, f"{at} batches")
        assert proc.poll() is None, err.read_text()[-3000:]
        family = descendants(proc.pid)
        (os.killpg if group else os.kill)(proc.pid, sig)
        proc.wait(DEADLINE)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    wait_for(lambda: gone(family), "the run's processes to end")  # the cluster's scheduler has its own session
    state = z.load_state(ckpt)
    done = state["step"]["global_step"]
    assert state["step"]["batches_in_step"] == 0  # the last completed step
    if sig == signal.SIGKILL:
        assert proc.returncode == -signal.SIGKILL and done % 5 == 0
    else:
        lines = out.read_text().splitlines()
        assert proc.returncode == 128 + sig
        name = signal.Signals(sig).name
        assert lines[-1] == (f"zephon-dask run: stopped by {name} after {done} of 1000 steps: "
                             f"checkpoint at global step {done} -> {ckpt}")
        errors = err.read_text()  # the embedded cluster's processes write here too: a quiet close
        assert not [n for n in ("Traceback", "Error", "ERROR", "WARNING", "Exception ignored") if n in errors], errors
    assert done * 4 <= ledger_lines(ledger)
    after = 6
    for group_id in (0, 1):  # resumed on dp=2, one process per group
        assert cli(["run", str(long_recipe), "--steps", str(after), "--resume", str(ckpt), "--runner", "threads",
                    "--dp-degree", "2", "--dp-group-id", str(group_id), "--ledger", str(ledger)]) == 0
    assert cli(["run", str(long_recipe), "--steps", str(done + after), "--runner", "threads",
                "--ledger", str(tmp_path / "whole")]) == 0
    assert cli(["verify", str(tmp_path / "whole"), str(ledger)]) == 0


def test_checkpoint_every_needs_a_checkpoint(long_recipe, capsys):
    assert cli(["run", str(long_recipe), "--steps", "2", "--checkpoint-every", "1"]) == 2
    assert "--checkpoint-every needs --checkpoint" in capsys.readouterr().err


# -- torchrun ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("sig, seed", [(signal.SIGTERM, 4), (signal.SIGINT, 5)])
def test_a_preempted_torchrun_job_checkpoints_its_last_step_and_resumes_on_one_rank(corpus_dir, tmp_path, sig, seed):
    """SIGTERM to torchrun (which passes it to both ranks) or SIGINT to the whole group (both ranks
    get it from the terminal and again from torchrun): both ranks stop at the same step."""
    at = int(np.random.default_rng(seed).integers(16, 160))
    ckpt, ledger = tmp_path / "ckpt.json", tmp_path / "split"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(JOB),
           "--corpus", str(corpus_dir), "--steps", "30", "--ledger", str(ledger), "--save", str(ckpt),
           "--step-s", "0.05"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: ledger_lines(ledger) >= at or proc.poll() is not None, f"{at} batches")
        (os.killpg if sig == signal.SIGINT else os.kill)(proc.pid, sig)
        out, _ = proc.communicate(timeout=DEADLINE)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    done = json.loads(ckpt.read_text())["state"]["step"]["global_step"]
    assert done < 30, out[-3000:]  # stopped before the end
    assert out.count(f"stopped at global step {done}") == 2, out[-3000:]
    resumed = build(corpus_dir, R=8, k=1, microbatch=2, runner="synchronous", ledger=str(ledger))
    resumed.load_state_dict(z.load_state(ckpt))
    truth = build(corpus_dir, R=8, k=1, microbatch=2, runner="synchronous", ledger=str(tmp_path / "truth"))
    with resumed, truth:
        for _ in zip(range((30 - done) * 8), resumed, strict=False):
            pass
        for _ in zip(range(30 * 8), truth, strict=False):
            pass
    assert cli(["verify", str(tmp_path / "truth"), str(ledger)]) == 0


def test_a_delivery_is_recorded_with_no_call_an_interrupt_could_land_in():
    """``Progress.observe`` records a delivery with plain stores and ends with one call: CPython runs
    signal handlers only after calls and backward jumps, so a Ctrl-C leaves the state before or
    after the delivery, never halfway (``state_dict()`` is then exact)."""
    import dis
    import inspect

    from zephon_dask.state.progress import Progress

    source, first = inspect.getsourcelines(Progress.observe)
    lines = {text.strip(): first + i for i, text in enumerate(source)}
    begin = lines["self.lane[lane] = now"]
    end = lines["self._undo.append(undo)"]
    calls = [(ins.positions.lineno, ins.opname) for ins in dis.get_instructions(Progress.observe)
             if ins.positions and ins.positions.lineno is not None and begin <= ins.positions.lineno <= end
             and ("CALL" in ins.opname or "JUMP_BACKWARD" in ins.opname)]
    assert calls and {line for line, _ in calls} == {end}, calls


@pytest.fixture
def one_torch_thread():
    """One torch thread, as the job uses: a step's sums then come out the same, bit for bit."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


FULL_RUNS: dict = {}  # framework -> the uninterrupted run (inputs, model), shared by the cases


@pytest.mark.parametrize("framework, seed, at_once", [("hf", 6, False), ("lightning", 7, False),
                                                       ("hf", 8, True), ("lightning", 9, True)])
def test_a_preempted_trainer_saves_its_step_and_resumes_exactly(corpus_dir, tmp_path_factory, tmp_path, framework,
                                                                seed, at_once, one_torch_thread):
    """SIGTERM at a seeded step of a real training run with dropout, no random generator code of the
    user's. The Trainer (``StopOnPreemption``) saves ``checkpoint-N`` at the end of that step and
    exits 143; Lightning stops after the current micro-batch and ``OnExceptionCheckpoint`` saves the
    weights of step N with the data state of the batches they trained and the generators of step N.
    At once (``Preemption(at_once=True)``): SIGTERM while the second micro-batch's forward sleeps a
    minute; the checkpoint of the last completed step is written and the process ends before that
    forward wakes. Resumed from it, the run trains what the uninterrupted one trains after step N,
    to the same weights."""
    pytest.importorskip("transformers")
    if framework == "lightning":
        pytest.importorskip("pytorch_lightning")
    import torch

    from tests.jobs.preempted_trainer_job import train_hf, train_lightning

    steps, at = 12, int(np.random.default_rng(seed).integers(2, 9))
    out = tmp_path / "run"
    job = [sys.executable, str(Path(__file__).resolve().parents[1] / "jobs" / "preempted_trainer_job.py"), "--framework", framework,
           "--corpus", str(corpus_dir), "--out", str(out), "--steps", str(steps)]
    job += (["--at-once", "--sleep-at", str(4 * at + 1)] if at_once  # step `at`'s second micro-batch
            else ["--step-s", "0.1"])
    proc = subprocess.Popen(job, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        if at_once:
            wait_for(lambda: proc.poll() is not None or (out / "sleeping").exists(), "the long forward")
        else:
            wait_for(lambda: proc.poll() is not None or ((out / "steps").exists()
                                                         and int((out / "steps").read_text() or 0) >= at), f"step {at}")
        os.kill(proc.pid, signal.SIGTERM)
        output, _ = proc.communicate(timeout=DEADLINE)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    if framework == "hf":
        assert proc.returncode == 143, output[-3000:]
        (checkpoint,) = out.glob("checkpoint-*")
        done = int(checkpoint.name.split("-")[1])
        train = train_hf
    else:  # Lightning ends a SIGTERM with its own SystemExit
        checkpoint = tmp_path / "on_exception.ckpt"
        (out / "on_exception.ckpt").rename(checkpoint)
        done = torch.load(checkpoint, weights_only=True)["global_step"]
        train = train_lightning
    if at_once:
        assert proc.returncode == 143 and not (out / "woke").exists(), output[-3000:]  # stopped mid-forward
        assert done == at, output[-3000:]
    assert at <= done < steps, output[-3000:]
    if framework not in FULL_RUNS:
        FULL_RUNS[framework] = train(corpus_dir, tmp_path_factory.mktemp("full"), steps)
    full, model = FULL_RUNS[framework]
    resumed, model2 = train(corpus_dir, tmp_path / "resumed", steps, resume=str(checkpoint))
    assert len(full) % steps == 0 and resumed == full[done * len(full) // steps:]
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), model2.parameters(), strict=True))
