"""The typed state: ``State.from_dict``/``to_dict`` keep the saved dict exactly, validate once,
and refuse every malformed part with its own message."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import zephon_dask as z
from tests.helpers.oracles import batch_rows
from tests.helpers.pipelines import build
from zephon_dask.errors import StateError
from zephon_dask.state import FORMAT, VERSION, LaneProgress, State, StepProgress, check_state
from zephon_dask.state.schema import STEP_FIELDS

V1 = Path(__file__).resolve().parents[1] / "data" / "state-v1.json"

counts = st.integers(0, 2**62)
positive = st.integers(1, 2**62)
scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
configs = st.dictionaries(st.text(max_size=6), st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8), max_size=4)
states = st.builds(
    State, fingerprint=st.text(max_size=64), config=configs,
    lanes=st.dictionaries(st.integers(0, 10**9 - 1),
                          st.builds(LaneProgress, counts, counts, counts, st.booleans()), max_size=6),
    pointers=st.dictionaries(st.text(max_size=12), counts, max_size=3),
    step=st.builds(StepProgress, **{name: positive if name in ("batches_per_step", "dp_degree", "global_batches")
                                    else counts for name in STEP_FIELDS}),
)


def same_bytes(a: dict, b: dict) -> bool:
    """Equal, and written alike in key order (what torch.save and json.dumps keep)."""
    return a == b and json.dumps(a) == json.dumps(b)


@settings(max_examples=200, deadline=None)
@given(state=states)
def test_a_state_round_trips_through_its_dict_and_json(state):
    d = state.to_dict()
    assert State.from_dict(d) == state
    assert State.from_dict(json.loads(json.dumps(d))) == state
    assert same_bytes(State.from_dict(d).to_dict(), d)
    assert check_state(d) == d and check_state(d) is not d


@pytest.mark.filterwarnings("ignore::zephon_dask.errors.ZephonWarning")  # mid-step states are states too
def test_every_state_a_run_writes_round_trips(corpus_dir, tmp_path):
    """The dicts of a run, a rank, a merge, a resume on another degree, a run's end, a loader, a
    migrated v1 file: ``to_dict(from_dict(d))`` is ``d``, byte for byte."""
    written = []  # every sample (drop_last_step=False): a run to the stream's end finishes its lanes
    with build(corpus_dir, runner="synchronous", drop_last_step=False, global_batches_per_step=4) as whole:
        it = iter(whole)
        for _ in range(7):
            next(it)
        written += [whole.state_dict(), whole.state_dict(ahead=2)]
    ranks = []
    for group in (0, 1):  # a resume on dp 2 of the dp 1 state, one step on
        with build(corpus_dir, runner="synchronous", drop_last_step=False, dp_degree=2, dp_group_id=group) as rank:
            rank.load_state_dict(written[0])
            it = iter(rank)
            for _ in range(3):
                next(it)
            ranks.append(rank.state_dict())
    written += ranks + [z.merge_states(ranks)]
    with build(corpus_dir, runner="synchronous", drop_last_step=False) as rest:
        rest.load_state_dict(written[-1])
        for _ in rest:  # to the end of the stream: finished lanes
            pass
        written.append(rest.state_dict())
        loader = rest.to_torch_loader()
        next(iter(loader))
        written.append(loader.state_dict())
        dataset = rest.to_torch_dataset()
        next(iter(dataset))
        written.append(dataset.state_dict()["state"])
    written += [z.load_state(z.save_state(tmp_path / "s.json", written[-1])), z.load_state(V1)]
    assert any(p["finished"] for d in written for p in d["lanes"].values())
    for d in written:
        state = State.from_dict(d)
        assert same_bytes(state.to_dict(), d) and State.from_dict(state.to_dict()) == state


def test_a_loaded_or_saved_state_may_be_typed(corpus_dir, tmp_path):
    with build(corpus_dir, runner="synchronous") as pipe:
        it = iter(pipe)
        for _ in range(5):
            next(it)
        saved = pipe.state_dict()
    assert z.load_state(z.save_state(tmp_path / "s.json", State.from_dict(saved))) == saved
    runs = []
    for state in (saved, State.from_dict(saved)):
        with build(corpus_dir, runner="synchronous") as pipe:
            pipe.load_state_dict(state)
            runs.append([batch_rows(b) for _, b in zip(range(6), pipe)])
    assert runs[0] == runs[1] and len(runs[0]) == 6


def test_merge_names_every_diverged_peer(corpus_dir):
    """Two peers that each disagree with the first on the same lane: named, not a TypeError."""
    with build(corpus_dir, runner="synchronous") as pipe:
        it = iter(pipe)
        for _ in range(5):
            next(it)
        first = pipe.state_dict()
    second, third = copy.deepcopy(first), copy.deepcopy(first)
    second["lanes"]["0"]["offset"] += 1
    third["lanes"]["0"]["offset"] += 2
    with pytest.raises(StateError, match=r"DP peers disagree on lanes \[0\].*\(state 1\).*\(state 2\)"):
        z.merge_states([first, second, third])


def _good() -> dict:
    """A well-formed state of this version: :func:`_v2` migrated."""
    return check_state(_v2())


def _v2() -> dict:
    """A state as version 2 wrote it."""
    return {"format": FORMAT, "version": 2, "fingerprint": "ab" * 32,
            "config": {"canonical_replicas": 4},
            "lanes": {"0": {"window": 1, "offset": 2, "batches_delivered": 3, "finished": False}},
            "pointers": {"0/1:0": 0},
            "step": {"global_step": 1, "batches_in_step": 0, "batches_per_step": 2, "dp_degree": 1,
                     "global_batches": 2, "microbatch_size": 4}}


def _v1() -> dict:
    return json.loads(V1.read_text())["state"]


def _edit(change, base=_good):
    state = base()
    change(state)
    return state


LANE = r"\['lanes'\]\['0'\] = .* is malformed; expected a lane id of ASCII digits"
STEP_V2 = r"\['step'\] = .* is malformed; expected \{" + ", ".join(STEP_FIELDS) + r"\}"
STEP_V1 = r"\['step'\] = .* is malformed; expected \{global_step, batches_in_step, batches_per_step, dp_degree\}"
POSITIVE = "batches_per_step, dp_degree and global_batches must be positive"
MALFORMED = [
    ([1, 2], "must be a dict from Pipeline.state_dict[(][)], got list"),
    (_edit(lambda s: s.update(format="other")), "has format 'other', expected 'zephon_dask.state'"),
    (_edit(lambda s: s.update(version=0)), f"has version 0; expected an int from 1 to {VERSION}"),
    (_edit(lambda s: s.update(version=True)), "has version True; expected an int"),
    (_edit(lambda s: s.update(version=99)), "has version 99, newer than this zephon_dask understands"),
    (_edit(lambda s: [s.pop("lanes"), s.pop("step")]), r"lacks \['lanes', 'step'\]: it is truncated"),
    (_edit(lambda s: s.update(fingerprint=3)), "has a malformed fingerprint or config"),
    (_edit(lambda s: s.update(config=[])), "has a malformed fingerprint or config"),
    (_edit(lambda s: s.update(lanes=[])), r"\['lanes'\] must be a dict of lane id -> progress"),
    (_edit(lambda s: s["lanes"].update({"01": s["lanes"]["0"]})), r"\['lanes'\]\['01'\] = .* is malformed"),
    (_edit(lambda s: s["lanes"].update({3: s["lanes"]["0"]})), r"\['lanes'\]\[3\] = .* is malformed"),
    (_edit(lambda s: s["lanes"]["0"].update(window=-1)), LANE),
    (_edit(lambda s: s["lanes"]["0"].update(offset=True)), LANE),
    (_edit(lambda s: s["lanes"]["0"].update(finished=1)), LANE),
    (_edit(lambda s: s["lanes"]["0"].update(extra=0)), LANE),
    (_edit(lambda s: s["lanes"]["0"].pop("finished")), LANE),
    (_edit(lambda s: s["lanes"]["0"].update(batches_delivered=2**62 + 1)), LANE),
    (_edit(lambda s: s["pointers"].update(k=-1)), r"\['pointers'\] = .* must map keys to lane ids"),
    (_edit(lambda s: s.update(pointers=[])), r"\['pointers'\] = \[\] must map keys to lane ids"),
    (_edit(lambda s: s.update(step=[])), STEP_V2),
    (_edit(lambda s: s["step"].pop("microbatch_size")), STEP_V2),
    (_edit(lambda s: s["step"].update(global_step=-1)), STEP_V2),
    (_edit(lambda s: s["step"].update(batches_per_step=0)), POSITIVE),
    (_edit(lambda s: s["step"].update(dp_degree=0)), POSITIVE),
    (_edit(lambda s: s["step"].update(global_batches=0)), POSITIVE),
    (_edit(lambda s: s["step"].update(global_batches=4), _v1), STEP_V1),
    (_edit(lambda s: s["step"].update(batches_per_step=0), _v1), POSITIVE),
    (_edit(lambda s: s["lanes"]["0"].update(window="1"), _v1), LANE),
]


@pytest.mark.parametrize("state, message", MALFORMED)
def test_every_malformed_part_is_refused_once_by_name(state, message):
    with pytest.raises(StateError, match=message) as refused:
        State.from_dict(state, where="the test state")
    assert str(refused.value).startswith("the test state")
    with pytest.raises(StateError, match=message):
        z.merge_states([state])
