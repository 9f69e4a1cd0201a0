"""torchdata's StatefulDataLoader, ``to_torch_loader()`` and fetch-ahead: exact, O(1) resumes.

The truth is the uninterrupted loader's stream (and, without workers, the
oracle ``ref_group_stream``). Resume cost is measured by which windows a
resumed run computes, never by time: only windows at or after each lane's
saved frontier may be computed.
"""

from __future__ import annotations

import io
import json
import pickle
from pathlib import Path

import pytest
import torch

import zephon_dask as z
from tests.helpers.oracles import batch_rows, ref_group_stream
from tests.helpers.pipelines import build
from zephon_dask.consumer import fetcher as fetcher_module
from zephon_dask.errors import StateError
from zephon_dask.pipeline.ranks import owned_lanes
from zephon_dask.pipeline.torch_data import PipelineDataset, PipelineLoader
from zephon_dask.state import dataset_state

StatefulDataLoader = pytest.importorskip("torchdata.stateful_dataloader").StatefulDataLoader


def rows(item):
    """A delivered item as ``(lane, index_in_lane, token rows)``."""
    tokens = [row[:n].tolist() for row, n in zip(item["tokens"], item["lengths"])]
    return int(item["lane"]), int(item["index_in_lane"]), tokens


def loader(pipe, workers):
    return StatefulDataLoader(pipe.to_torch_dataset(), batch_size=None, num_workers=workers,
                              multiprocessing_context="fork" if workers else None)


def dataset_states(state):
    """Every PipelineDataset state nested in a StatefulDataLoader state."""
    if isinstance(state, dict):
        if state.get("format") == dataset_state.FORMAT:
            return [state]
        return [s for v in state.values() for s in dataset_states(v)]
    return []


@pytest.fixture
def windows_log(tmp_path, monkeypatch):
    """A file that gets ``lane window`` for every window submitted, in this process or a forked worker."""
    log = tmp_path / "windows.log"
    submit = fetcher_module.WindowFetcher.submit

    def logged(self, lane, w):
        with open(log, "a") as f:
            f.write(f"{lane} {w}\n")
        return submit(self, lane, w)

    monkeypatch.setattr(fetcher_module.WindowFetcher, "submit", logged)

    def read_and_clear():
        pairs = [tuple(map(int, line.split())) for line in log.read_text().splitlines()] if log.exists() else []
        log.unlink(missing_ok=True)
        return pairs

    return read_and_clear


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])  # slow: worker processes
def test_stateful_dataloader_resumes_exactly_and_in_constant_time(corpus_dir, workers, windows_log):
    with build(corpus_dir, runner="synchronous") as pipe:
        full = [rows(item) for item in loader(pipe, workers)]
        if workers == 0:
            assert full == ref_group_stream(pipe.spec, owned_lanes(pipe.description.settings), 3)
    windows_log()
    last = len(full)
    for k in (0, 1, 7, last - 1, last):
        with build(corpus_dir, runner="synchronous") as pipe:
            first = loader(pipe, workers)
            head = []
            if k:
                for item in first:
                    head.append(rows(item))
                    if len(head) == k:
                        break
            state = first.state_dict()
            del first
        buffer = io.BytesIO()
        torch.save(state, buffer)  # how frameworks store it; plain builtins load with weights_only
        state = torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)
        frontier = {}
        for ds in dataset_states(state):
            assert json.loads(json.dumps(ds)) == ds
            frontier.update({int(lane): p["window"] for lane, p in ds["state"]["lanes"].items()})
        windows_log()
        # the state's seed wins; with workers, a finite stream's later passes need it built in
        with build(corpus_dir, runner="synchronous", seed=99 if workers == 0 else 5) as pipe:
            second = loader(pipe, workers)
            second.load_state_dict(state)
            tail = [rows(item) for item in second]
        assert head + tail == full, f"cut at {k} of {last}"
        computed = windows_log()
        assert computed or k == last
        assert all(w >= frontier[lane] for lane, w in computed), "a window before the frontier was recomputed"


@pytest.mark.parametrize("workers", [0, 2])
def test_loader_states_of_the_previous_format_resume_exactly(corpus_dir, workers):
    """tests/data/loader-states-v2.json: StatefulDataLoader states written before a dataset state
    recorded the group's step (its version 2 counted a worker's own lanes as a step), after 7 items
    of ``build(corpus, runner="synchronous", batches_per_step=4)`` with 0 and 2 workers (2 lanes
    each: their states said 2 batches a step). They resume exactly, their count recounted in the
    pipeline's step of 4 batches."""
    old = json.loads((Path(__file__).resolve().parents[1] / "data" / "loader-states-v2.json").read_text())[str(workers)]
    assert {ds["version"] for ds in dataset_states(old)} == {2}
    assert {ds["state"]["step"]["global_batches"] for ds in dataset_states(old)} == {4 // max(workers, 1)}
    with build(corpus_dir, runner="synchronous", batches_per_step=4) as pipe:
        full = [rows(item) for _, item in zip(range(20), loader(pipe, workers))]
    with build(corpus_dir, runner="synchronous", batches_per_step=4) as pipe:
        second, tail = loader(pipe, workers), []
        second.load_state_dict(old)
        for item in second:
            tail.append(rows(item))
            if len(tail) == 1:
                state = second.state_dict()
            if len(tail) == 13:
                break
        del second
    assert tail == full[7:]
    assert {ds["version"] for ds in dataset_states(state)} == {dataset_state.VERSION}
    assert [(s["global_step"], s["batches_in_step"], s["global_batches"])
            for s in (ds["state"]["step"] for ds in dataset_states(state))] == [(2, 0, 4)] * max(workers, 1)


def test_a_pipeline_pickles_with_its_settings_read_only(corpus_dir):
    pipe = build(corpus_dir, runner="synchronous")
    copy = pickle.loads(pickle.dumps(pipe.to_torch_dataset())).pipeline
    assert copy.fingerprint() == pipe.fingerprint()
    assert copy.description.settings == pipe.description.settings
    with pytest.raises(TypeError):
        copy.description.settings["canonical_replicas"] = 2  # type: ignore[index]


@pytest.mark.slow  # worker processes, each a fresh interpreter
def test_workers_started_without_fork_deliver_and_resume_as_forked_ones(corpus_dir):
    """``spawn`` (macOS's default), like ``forkserver`` (Linux's from Python 3.14), pickles the
    dataset, its pipeline and description included, to each worker."""
    context = "spawn"
    def started(pipe, how):
        return StatefulDataLoader(pipe.to_torch_dataset(), batch_size=None, num_workers=2,
                                  multiprocessing_context=how)

    with build(corpus_dir, runner="synchronous") as pipe:
        full = [rows(item) for item in started(pipe, "fork")]
    with build(corpus_dir, runner="synchronous") as pipe:
        first = started(pipe, context)
        it = iter(first)
        head = [rows(next(it)) for _ in range(5)]
        state = first.state_dict()
        del it, first
    with build(corpus_dir, runner="synchronous") as pipe:
        second = started(pipe, context)
        second.load_state_dict(state)
        tail = [rows(item) for item in second]
    assert head + tail == full


def test_stateful_dataloader_refuses_another_worker_count(corpus_dir):
    with build(corpus_dir, runner="synchronous") as pipe:
        first = loader(pipe, 0)
        next(iter(first))
        state = first.state_dict()
    with build(corpus_dir, runner="synchronous") as pipe:
        ds = pipe.to_torch_dataset()
        inner = dataset_states(state)[0]
        with pytest.raises(StateError, match="num_workers=0.*to_torch_loader"):
            ds.load_state_dict(dict(inner, num_workers=2, worker=1))
        with pytest.raises(StateError, match="positive|malformed"):
            ds.load_state_dict(dict(inner, state=dict(inner["state"], step={})))
        with pytest.raises(StateError, match="version 4.*upgrade"):
            ds.load_state_dict(dict(inner, version=4))


@pytest.mark.parametrize("taken,resumed", [(0, 2), (2, 0), pytest.param(2, 3, marks=pytest.mark.slow)])
def test_a_loader_state_of_another_num_workers_is_refused_at_load(corpus_dir, taken, resumed):
    """torchdata fails at the next iter() with a bare AssertionError; the loader's own
    load_state_dict names both worker counts and the fix, and the loader still takes its own state."""
    with build(corpus_dir, runner="synchronous") as pipe:
        first = loader(pipe, taken)
        it = iter(first)
        for _ in range(5):
            next(it)
        state = first.state_dict()
        rest = [rows(next(it)) for _ in range(3)]
        del it, first
    with build(corpus_dir, runner="synchronous") as pipe:
        other = loader(pipe, resumed)
        with pytest.raises(StateError, match=rf"num_workers={taken}, but it is loaded with "
                                             rf"num_workers={resumed}.*resume with num_workers={taken}"
                                             r".*to_torch_loader"):
            other.load_state_dict(state)
        assert other.next_iter_state is None  # nothing was loaded
        same = loader(pipe, taken)
        same.load_state_dict(state)
        assert [rows(item) for _, item in zip(range(3), same)] == rest


# -- to_torch_loader(): a real DataLoader whose state is the pipeline's ------------------------


def test_to_torch_loader_is_a_dataloader_with_the_pipelines_state(corpus_dir):
    with build(corpus_dir, runner="synchronous") as pipe:
        truth = ref_group_stream(pipe.spec, owned_lanes(pipe.description.settings), 3)
        dl = pipe.to_torch_loader(num_workers=2)
        assert isinstance(dl, torch.utils.data.DataLoader) and isinstance(dl.dataset, PipelineDataset)
        head = []
        for item in dl:
            head.append(rows(item))
            if len(head) == 9:
                break
        state = dl.state_dict()
        assert type(state) is dict and state == pipe.state_dict()
        assert torch.load(_saved(state), weights_only=True) == state
    with build(corpus_dir, runner="synchronous") as pipe:
        dl = PipelineLoader(pipe, num_workers=0)  # another worker count: the pipeline's state allows it
        dl.load_state_dict(state)
        assert head + [rows(item) for item in dl] == truth
    with pytest.raises(z.ConfigError, match="batch_size"):
        build(corpus_dir).to_torch_loader(batch_size=4)


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])  # slow: worker processes
def test_a_loader_state_taken_after_a_pass_resumes_as_torchdata_does(corpus_dir, workers):
    """A StatefulDataLoader state taken after a pass's last batch, before the loader ended, resumes
    as torchdata resumes its own datasets there: that iteration's rest is empty, the next iteration
    is a new pass. The pipeline's own loader (to_torch_loader()) goes on into the next pass at once."""
    with build(corpus_dir, runner="synchronous") as pipe:
        whole = [rows(item) for item in loader(pipe, workers)]
    with build(corpus_dir, runner="synchronous") as pipe:
        dl = loader(pipe, workers)
        it = iter(dl)
        for _ in whole:
            next(it)
        state = dl.state_dict()
    with build(corpus_dir, runner="synchronous") as pipe:
        dl = loader(pipe, workers)
        dl.load_state_dict(state)
        assert [rows(item) for item in dl] == []
        assert [rows(item) for item in dl] == whole
    plain = StatefulDataLoader(list(range(6)), batch_size=2)  # torchdata's own, over a list
    it = iter(plain)
    for _ in range(3):
        next(it)
    again = StatefulDataLoader(list(range(6)), batch_size=2)
    again.load_state_dict(plain.state_dict())
    assert (len(list(again)), len(list(again))) == (0, 3)
    with build(corpus_dir, runner="synchronous") as pipe:
        dl = pipe.to_torch_loader(num_workers=workers)
        steps = [rows(item) for item in dl]  # whole steps of the group (the dataset's workers each end alone)
        state = dl.state_dict()
    with build(corpus_dir, runner="synchronous") as pipe:
        dl = pipe.to_torch_loader(num_workers=workers)
        dl.load_state_dict(state)
        assert [rows(item) for item in dl] == steps


def _saved(obj):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return buffer


def test_plain_dataloader_never_reports_a_silent_zero(corpus_dir):
    with build(corpus_dir, runner="synchronous") as pipe:
        dl = torch.utils.data.DataLoader(pipe.to_torch_dataset(), batch_size=None)
        for n, _ in enumerate(dl):
            if n == 5:
                break
        with pytest.raises(StateError, match="to_torch_dataset.*StatefulDataLoader.*to_torch_loader"):
            pipe.state_dict()
        it = iter(pipe)  # iterating the pipeline itself makes its state visible again
        next(it)
        assert pipe.state_dict()["lanes"]["0"]["batches_delivered"] == 1


# -- consumed, not fetched ------------------------------------------------------------------------


def framework_loop(source, steps, per_step, ahead, how, pipe):
    """A training loop that fetches ``ahead`` batches beyond the one its step uses (as Lightning
    and accelerate do) and takes the state after its last step the way ``how`` says."""
    it, buffer, consumed = iter(source), [], []
    for _ in range(steps):
        for _ in range(per_step):
            while len(buffer) < 1 + ahead:
                buffer.append(next(it))
            batch = buffer.pop(0)
            consumed.append(batch)
            if how == "mark":
                pipe.session.mark_consumed(batch)
    if how == "at_step":
        return consumed, pipe.state_dict(at_step=steps)
    if how == "ahead":
        return consumed, pipe.state_dict(ahead=ahead)
    return consumed, pipe.state_dict()


@pytest.mark.parametrize("ahead", [0, 1, 2])
@pytest.mark.parametrize("how", ["mark", "at_step", "ahead"])
@pytest.mark.parametrize("via", ["iter", "loader"])
def test_state_after_step_n_resumes_at_step_n_plus_1(corpus_dir, ahead, how, via):
    opts = dict(runner="synchronous", batches_per_step=4)
    with build(corpus_dir, **opts) as pipe:
        truth = ref_group_stream(pipe.spec, owned_lanes(pipe.description.settings), 3)
        source = pipe if via == "iter" else pipe.to_torch_loader()
        consumed, state = framework_loop(source, 5, 4, ahead, how, pipe)
    got = [rows(b) if via == "loader" else batch_rows(b) for b in consumed]
    assert got == truth[:20]
    assert state["step"]["global_step"] == 5 and state["step"]["batches_in_step"] == 0
    with build(corpus_dir, **opts) as pipe:
        resumed = pipe.load_state_dict(state)
        nxt = next(iter(resumed))
    assert (nxt.lane, nxt.index_in_lane) == truth[20][:2]


def test_fetch_ahead_limits_are_named(corpus_dir):
    with build(corpus_dir, runner="synchronous") as pipe:
        with pytest.raises(StateError, match="iterate the pipeline first"):
            pipe.session.mark_consumed(0)
        it = iter(pipe)
        batches = [next(it) for _ in range(70)]
        with pytest.raises(StateError, match="go back 64"):
            pipe.state_dict(ahead=65)
        with pytest.raises(StateError, match="not among the last 64"):
            pipe.session.mark_consumed(batches[2])
        with pytest.raises(StateError, match="ahead= or at_step="):
            pipe.state_dict(ahead=1, at_step=3)
        pipe.session.mark_consumed(batches[60])
        assert pipe.state_dict() == pipe.state_dict(ahead=9)
        assert pipe.state_dict()["lanes"][str(batches[60].lane)]["batches_delivered"] == batches[60].index_in_lane + 1


# -- states the stream cannot have produced; iterators that were superseded --------------------


def saved_then_edited(tmp_path, corpus_dir, edit):
    """A real checkpoint, edited and saved again with a valid checksum."""
    with build(corpus_dir, runner="synchronous") as pipe:
        it = iter(pipe)
        for _ in range(6):
            next(it)
        state = pipe.state_dict()
    edit(state)
    return z.load_state(z.save_state(tmp_path / "edited.json", state))


@pytest.mark.parametrize("edit,match", [
    (lambda s: s["lanes"]["1"].update(offset=10**6), "sample 1000000 of window"),
    (lambda s: s["lanes"]["1"].update(window=10**6), "beyond the lane's last window"),
    (lambda s: [p.update(finished=True) for p in s["lanes"].values()], "finished at"),
    (lambda s: s["lanes"]["3"].update(batches_delivered=0), "position moves exactly"),
])
def test_progress_beyond_the_stream_is_refused(tmp_path, corpus_dir, edit, match):
    """Refused at load where the spec can tell, else before the lane delivers a wrong batch."""
    state = saved_then_edited(tmp_path, corpus_dir, edit)
    got = []
    with build(corpus_dir, runner="synchronous") as pipe, pytest.raises(StateError, match=match):
        for batch in pipe.load_state_dict(state):
            got.append(batch.lane)
    assert 1 not in got and len(got) < 4


@pytest.mark.parametrize("key", ["\u0663", "+1", "01", " 1", "1" * 12])
def test_lane_keys_are_ascii_decimal(tmp_path, corpus_dir, key):
    def rekey(state):
        state["lanes"][key] = state["lanes"].pop("1")

    with pytest.raises(StateError, match="ASCII digits"):
        saved_then_edited(tmp_path, corpus_dir, rekey)


def test_endless_stream_cannot_be_finished(corpus_dir):
    web = z.Dataset.from_jsonl("web", str(corpus_dir / "web"), progress=False)
    ws = z.MixtureWorkSource([web], chunk_size=12, seed=1, exhausted_policy="repeat")
    pipe = z.Pipeline(ws).tokenize().pack(64).batch(2).options(canonical_replicas=4, runner="synchronous")
    state = pipe.state_dict()
    state["lanes"]["2"]["finished"] = True
    with pytest.raises(StateError, match="never ends"):
        pipe.load_state_dict(state)


def test_a_newer_iterator_supersedes_the_older(corpus_dir, tmp_path):
    with build(corpus_dir, runner="synchronous", ledger=str(tmp_path / "ledger")) as pipe:
        truth = ref_group_stream(pipe.spec, owned_lanes(pipe.description.settings), 3)
        first = iter(pipe)
        next(first), next(first)
        second = iter(pipe)
        with pytest.raises(StateError, match="superseded"):
            next(first)
        got = [next(second) for _ in range(3)]
        assert [(b.lane, b.index_in_lane) for b in got] == [t[:2] for t in truth[:3]]
        assert pipe.state_dict()["lanes"]["0"]["batches_delivered"] == 1  # follows the live iterator
        state = pipe.state_dict()
        pipe.load_state_dict(state)  # while iterating: the old iterator is superseded, the state true
        with pytest.raises(StateError, match="superseded"):
            next(second)
        assert pipe.state_dict() == state
        rest = [(b.lane, b.index_in_lane) for b in pipe]
    assert rest == [t[:2] for t in truth[3:]]
    lines = (tmp_path / "ledger" / "rank-0.jsonl").read_text().splitlines()
    assert len(lines) == 2 + len(truth)  # the ledger stayed open for the live iterator


@pytest.mark.slow  # worker processes
def test_stateful_dataloader_with_an_idle_worker(corpus_dir):
    """4 lanes over 3 workers: worker 2 serves none, and its (empty) state resumes too."""
    with build(corpus_dir, runner="synchronous") as pipe:
        full = [rows(item) for item in loader(pipe, 3)]
    with build(corpus_dir, runner="synchronous") as pipe:
        first, head = loader(pipe, 3), []
        for item in first:
            head.append(rows(item))
            if len(head) == 7:
                break
        state = first.state_dict()
        del first
    assert [ds["lanes"] for ds in dataset_states(state)] == [[0, 2], [1, 3], []]
    with build(corpus_dir, runner="synchronous") as pipe:
        second = loader(pipe, 3)
        second.load_state_dict(state)
        assert head + [rows(item) for item in second] == full
