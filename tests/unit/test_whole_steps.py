"""``drop_last_step``: a finite stream's pass ends on a whole global step, against the oracle.

The oracle is each lane's batches from its windows computed one by one
(``ref_lane_batches``): a step holds G / R full batches of every lane, the pass's steps
are those every lane completes (``ref_whole_steps``), and each group delivers
exactly those steps' batches in strict round-robin, every pass; with
``drop_last_step=False`` it delivers every batch.
"""

from __future__ import annotations

import threading
import warnings
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import zephon_dask as z
from tests.helpers.oracles import batch_rows, ref_lane_batches, ref_whole_steps
from tests.helpers.pipelines import write_corpus
from zephon_dask.consumer.pass_end import StepAgreement
from zephon_dask.errors import StateError, ZephonWarning
from zephon_dask.pipeline.ranks import owned_lanes
from zephon_dask.pipeline.torch_data import whole_steps_only

DROPPED = "ends on its last whole global step"


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    root = write_corpus(tmp_path_factory.mktemp("whole_steps") / "web", n_files=2, docs=24, seed=4)
    return z.Dataset.from_jsonl("web", str(root), progress=False)


def build(small, R=2, cycles=1, dp=1, mapping="contiguous", microbatch=2, drop_last=True, chunk=4, k=1,
          passes=1, pack=None, seed=3, **options):
    source = z.MixtureWorkSource([small], chunk_size=chunk, seed=seed, stop_after_passes=passes)
    pipe = z.Pipeline(source).tokenize()
    if pack is not None:
        pipe = pipe.pack(48, algorithm=pack)
    return pipe.batch(microbatch, drop_last=drop_last).options(
        canonical_replicas=R, flush_every_k_chunks=k, global_batches_per_step=R * cycles, dp_degree=dp,
        mapping_strategy=mapping, runner="synchronous", **options)


@st.composite
def configs(draw):
    R = draw(st.integers(1, 4))
    return dict(R=R, cycles=draw(st.integers(1, 2)), dp=draw(st.sampled_from([d for d in (1, 2, 4) if R % d == 0])),
                mapping=draw(st.sampled_from(["contiguous", "interleaved"])), microbatch=draw(st.integers(1, 3)),
                drop_last=draw(st.booleans()), chunk=draw(st.integers(3, 7)), k=draw(st.integers(1, 2)),
                passes=draw(st.integers(1, 2)), pack=draw(st.sampled_from([None, "wrap", "first_fit"])),
                seed=draw(st.integers(0, 3)))


def round_robin(lanes: dict, owned: list[int], per_lane_batches: int | None) -> list:
    """Strict round-robin over ``owned``, each lane's first ``per_lane_batches`` batches (``None``: all)."""
    queues = {lane: list(lanes[lane][:per_lane_batches]) for lane in owned}
    out = []
    while any(queues.values()):
        out += [queues[lane].pop(0) for lane in owned if queues[lane]]
    return out


def served(pipe) -> tuple[list, bool]:
    """One pass's batches and whether the drop was warned."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = [batch_rows(b) for b in pipe]
    return got, any(DROPPED in str(w.message) for w in caught)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cfg=configs())
def test_every_pass_ends_on_a_whole_global_step(small, cfg):
    base = build(small, **cfg)
    spec, per_lane = base.spec, cfg["cycles"]
    lanes = {lane: ref_lane_batches(spec, lane, cfg["microbatch"], cfg["drop_last"]) for lane in range(cfg["R"])}
    full = {lane: sum(len(rows) == cfg["microbatch"] for _, _, rows in b) for lane, b in lanes.items()}
    steps = min(n // per_lane for n in full.values())  # every lane completes them (a partial batch: in none)
    assert base.num_steps() == steps
    for group in range(cfg["dp"]):
        pipe = base.options(dp_group_id=group)
        owned = owned_lanes(pipe.description.settings)
        per_rank = pipe.session.step_shape().per_rank
        whole = ref_whole_steps(spec, owned, cfg["microbatch"], cfg["drop_last"], per_lane)
        assert whole == steps or (cfg["pack"] and cfg["dp"] > 1)  # rows not known up front: the group's own
        got, warned = served(pipe)
        assert len(got) == whole * per_rank  # whole steps only
        assert got == round_robin(lanes, owned, whole * per_lane)
        assert warned == any(len(lanes[lane]) > whole * per_lane for lane in owned)  # dropped: warned
        if group == 0:
            assert served(pipe)[0] == got  # the next pass ends alike
        every, warned = served(pipe.options(drop_last_step=False))
        assert every == round_robin(lanes, owned, None) and not warned  # every sample


class ThreadVote:
    """A collective over ``n`` threads, one per DP group: each call returns whether every group's
    flag was true (what ``all_reduce(MIN)`` over the ranks gives), each call a barrier."""

    def __init__(self, n: int):
        self.flags = [True] * n
        self.barrier = threading.Barrier(n, timeout=120)

    def of(self, group: int):
        def vote(flag: bool) -> bool:
            self.flags[group] = flag
            self.barrier.wait()
            agreed = all(self.flags)
            self.barrier.wait()  # every group has read the flags before any writes the next
            return agreed
        return vote


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cfg=configs().filter(lambda c: c["dp"] > 1), pack=st.sampled_from(["wrap", "first_fit"]))
def test_groups_voting_on_each_step_end_a_packed_pass_on_the_same_step(small, cfg, pack):
    """Packed rows: no group knows the other groups' lanes, so each votes at every step's start
    whether it holds the step whole. Every group then delivers the steps every lane completes,
    the same as one group over all lanes, every batch in strict round-robin."""
    cfg = {**cfg, "pack": pack}
    base = build(small, **cfg)
    lanes = {lane: ref_lane_batches(base.spec, lane, cfg["microbatch"], cfg["drop_last"]) for lane in range(cfg["R"])}
    steps = min(sum(len(rows) == cfg["microbatch"] for _, _, rows in b) // cfg["cycles"] for b in lanes.values())
    assert base.num_steps() == steps
    vote, got, errors = ThreadVote(cfg["dp"]), {}, []

    def serve(group: int) -> None:
        try:
            pipe = base.options(dp_group_id=group)
            owned, per_rank = owned_lanes(pipe.description.settings), pipe.session.step_shape().per_rank
            stream = pipe.session.open_stream(owned, None)
            stream.agreement = StepAgreement(vote.of(group), per_rank)
            got[group] = (owned, per_rank, [batch_rows(b) for b in stream])
        except BaseException as exc:  # noqa: BLE001 - reported below, and the others released
            errors.append(exc)
            vote.barrier.abort()

    threads = [threading.Thread(target=serve, args=(g,)) for g in range(cfg["dp"])]
    with warnings.catch_warnings():  # here, not in the threads: the filters are the process's
        warnings.simplefilter("ignore", ZephonWarning)
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
    assert not errors, errors
    for owned, per_rank, batches in got.values():
        assert len(batches) == steps * per_rank
        assert batches == round_robin(lanes, owned, steps * cfg["cycles"])


def test_a_group_that_cannot_vote_says_so_where_its_pass_ends(small):
    pipe = build(small, R=2, dp=2, pack="wrap", seed=1)
    with pytest.warns(ZephonWarning, match="without torch.distributed") as caught:
        list(pipe)
    assert len(caught) == 1


def test_a_loader_over_workers_in_a_group_that_cannot_vote_says_so_where_its_pass_ends(small):
    """The loader's workers each end their own lanes; the main process ends the group's pass on its
    whole steps, and says, as the stream does, that the groups could not vote on where."""
    pipe = build(small, R=4, dp=2, pack="wrap", seed=1)
    loader = pipe.to_torch_loader(num_workers=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        served = list(loader)
    said = [str(w.message) for w in caught if "cannot vote" in str(w.message)]
    assert served and len(said) == 1, [str(w.message) for w in caught]
    assert said[0].startswith("the pass over the stream ends on the last whole global step of this DP group's lanes")


def test_a_loader_ends_where_its_shortest_worker_ends():
    """DataLoader workers each end their own lanes (a packed stream's rows are not known up front);
    after the shortest one's end the loader goes on with the others alone: those batches are no
    whole step. With real workers: test_state.py's test_dataloader_worker_count_change."""
    def loader(ends, start=0):  # two workers, one lane each, polled in turn while both serve
        order = [(lane, i) for i in range(start, max(ends)) for lane in (0, 1) if i < ends[lane]]
        return iter([{"lane": lane, "index_in_lane": i} for lane, i in order])

    def passed(items, delivered=0, strict=True):
        progress = SimpleNamespace(shape=SimpleNamespace(per_rank=4), delivered=delivered)
        return [(d["lane"], d["index_in_lane"]) for d in whole_steps_only(items, progress, 2, strict)]

    assert passed(loader((4, 9))) == [(lane, i) for i in range(4) for lane in (0, 1)]  # 2 steps, not 3
    assert passed(loader((4, 8), start=1), delivered=2) == [(lane, i) for i in range(1, 4) for lane in (0, 1)]
    assert len(passed(loader((4, 8)), strict=False)) == 12  # in readiness order only the count shows
    assert passed(loader((4, 9), start=4), delivered=8) == []  # resumed at the pass's end: nothing more


@pytest.mark.parametrize("dp", [2, 4])
def test_elastic_resume_keeps_the_steps_to_the_end_of_the_pass(small, dp):
    """Rows are samples: the pass's whole steps are the same at every degree. dp=1 stopped two steps
    before the end resumes on ``dp`` groups: the same global steps, then the next pass."""
    one = build(small, R=4, cycles=2, chunk=7, passes=2)
    steps = one.num_steps()
    lanes = {lane: ref_lane_batches(one.spec, lane, 2) for lane in range(4)}
    assert sorted(len(b) for b in lanes.values()) == [10, 10, 14, 14]  # lanes 2 and 3 go 2 steps further
    it = iter(one)
    head = [batch_rows(next(it)) for _ in range((steps - 2) * 8)]
    assert head == round_robin(lanes, list(range(4)), steps * 2)[:(steps - 2) * 8]
    state = one.state_dict()
    tails = []
    for group in range(dp):
        pipe = build(small, R=4, cycles=2, chunk=7, passes=2, dp=dp, dp_group_id=group).load_state_dict(state)
        assert pipe.num_steps() == steps
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ZephonWarning)
            tails.append([batch_rows(b) for b in pipe])  # the pass's last two steps
            it = iter(pipe)
            following = [batch_rows(next(it)) for _ in range(2 * 8 // dp)]
        assert len(tails[-1]) == 2 * 8 // dp
        assert following == round_robin(lanes, owned_lanes(pipe.description.settings), 4)  # the next pass
    per_rank = 8 // dp
    for step in range(2):
        resumed = sorted(b for tail in tails for b in tail[step * per_rank:(step + 1) * per_rank])
        assert resumed == sorted(round_robin(lanes, list(range(4)), steps * 2)[(steps - 2 + step) * 8:][:8])


@pytest.mark.parametrize("pack", [None, "first_fit"])
def test_a_mid_step_resume_on_another_degree_delivers_the_rest_of_the_whole_steps(small, pack):
    """dp=2 cut three batches into the last step but one (lanes 0 and 2 a batch ahead of 1 and 3),
    resumed on dp=1 (round-robin from lane 1): every batch up to the end of the pass's whole steps
    once, none after, although lane 2 reaches the end before lane 3."""
    def pipes(dp):
        return [build(small, R=4, cycles=2, chunk=7, passes=2, pack=pack, dp=dp, dp_group_id=g) for g in range(dp)]

    (one,) = pipes(1)
    steps = one.num_steps()
    lanes = {lane: ref_lane_batches(one.spec, lane, 2) for lane in range(4)}
    head = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ZephonWarning)  # "3 batches into a step": expected here
        before = pipes(2)
        for pipe in before:
            it = iter(pipe)
            head += [batch_rows(next(it)) for _ in range((steps - 2) * 4 + 3)]
        state = z.merge_states([p.state_dict() for p in before])
        tail = [batch_rows(b) for b in one.load_state_dict(state)]
    assert [state["lanes"][str(lane)]["batches_delivered"] for lane in range(4)] == [2 * steps - 2, 2 * steps - 3] * 2
    assert sorted(head + tail) == sorted(b for lane in range(4) for b in lanes[lane][:2 * steps])


def test_the_setting_is_data_a_recipe_key_and_refused_on_resume(small, tmp_path):
    keep = build(small, drop_last_step=False)
    default = build(small)
    assert "drop_last_step" not in default.spec.config()  # fingerprints from before the option stay
    assert keep.spec.config()["drop_last_step"] is False and keep.fingerprint() != default.fingerprint()
    with pytest.raises(StateError, match="drop_last_step"):
        build(small, drop_last_step=False).load_state_dict(default.state_dict())
    write_corpus(tmp_path / "web", n_files=1, docs=4)
    recipe = tmp_path / "r.toml"
    recipe.write_text('[[datasets]]\nname = "web"\npath = "web"\nformat = "jsonl"\n[tokenize]\n[batch]\n'
                      'microbatch_size = 2\n[options]\ndrop_last_step = false\n')
    assert z.Pipeline.from_config(recipe).spec.drop_last_step is False
    assert "every sample" in str(keep.explain().section("this DP group").text())


def test_a_packed_pass_serves_its_first_batch_without_waiting_for_every_lane(small):
    """The first step is served without looking ahead: the first batch needs its own lane's first
    window only (a lane short of the first step is an error then, where it shows); the second
    step looks ahead over every lane."""
    pipe = build(small, R=4, pack="first_fit")
    it = iter(pipe)
    next(it)
    assert pipe.session.stream.fetcher.next_needed == {0: 1, 1: 0, 2: 0, 3: 0}
    for _ in range(4):  # the rest of the first step (one batch of each lane), then the second's first
        next(it)
    assert all(w >= 1 for w in pipe.session.stream.fetcher.next_needed.values())
    pipe.close()
