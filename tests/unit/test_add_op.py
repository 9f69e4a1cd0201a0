"""``Pipeline.add_op``, ``validate`` and ``map_batch``: the door checks, placement by traits, the
fingerprint, and each rule of the operator contract refused by an operator breaking it alone."""

from __future__ import annotations

import itertools
import random
import re

import numpy as np
import pytest

import zephon_dask as z
from tests.helpers.oracles import batch_rows
from zephon_dask.errors import ConfigError, OperatorContractError, StateError
from zephon_dask.operators.identity import class_identity
from zephon_dask.operators.shuffle import Shuffle

# -- well-behaved operators: the built-ins' equivalents -----------------------------------------


def upper(record):
    return {**record, "text": record["text"].upper()}


class Upper(z.RecordOp):
    """What ``.map(upper)`` does."""

    name = "upper"
    one_to_one = True

    def spec(self):
        return {"op": self.name}

    def apply(self, record):
        return [upper(record)]


class UpperV2(Upper):
    """``Upper`` edited: the same name and spec, another method body."""

    __qualname__ = "Upper"

    def apply(self, record):
        return [{**record, "text": record["text"].upper() + " "}]


class Pinned(Upper):
    version = 3


class Suffix(z.RecordOp):
    name = "suffix"
    one_to_one = True

    def __init__(self, suffix):
        self.suffix = suffix

    def spec(self):
        return {"op": self.name, "suffix": self.suffix}

    def apply(self, record):
        return [{**record, "text": record["text"] + self.suffix}]


class MyShuffle(z.Accumulator):
    """What ``.shuffle(n)`` does."""

    name = "my_shuffle"
    one_to_one = True

    def __init__(self, n):
        self.n = n

    def spec(self):
        return {"op": self.name, "n": self.n}

    def apply(self, table, ctx):
        return Shuffle(self.n).apply(table, ctx)


class NoTokensNeeded(MyShuffle):
    """Says it needs no tokens: an accumulator sees token samples all the same."""

    needs_tokens = False


class EvenTokens(z.RecordOp):
    """Reads token ids: it goes after ``tokenize``."""

    name = "even_tokens"
    needs_tokens = True

    def spec(self):
        return {"op": self.name}

    def apply(self, record):
        return [record] if len(record["tokens"]) % 2 == 0 else []


class CharTokens(z.RecordOp):
    """A tokenizer of its own."""

    name = "char_tokens"
    one_to_one = True
    makes_tokens = True

    def spec(self):
        return {"op": self.name}

    def apply(self, record):
        return [{"tokens": np.frombuffer(record["text"].encode(), np.uint8).astype(np.int32)}]


# -- each breaks one rule ----------------------------------------------------------------------

_CALLS = itertools.count()


class Counter(Upper):
    name = "counter"

    def apply(self, record):
        return [{**record, "n": next(_CALLS)}]


class GlobalRandom(Upper):
    name = "global_random"

    def apply(self, record):
        return [{**record, "r": random.random()}]


class KeepsState(Upper):
    name = "keeps_state"
    seen = 0

    def apply(self, record):
        self.seen += 1
        return [record]


class InPlace(Upper):
    name = "in_place"

    def apply(self, record):
        record["text"] = record["text"].upper()
        return [record]


class DropsOneToOne(Upper):
    name = "drops"

    def apply(self, record):
        return [record] if len(record["text"]) % 2 else []


class NoTokens(CharTokens):
    name = "no_tokens"

    def apply(self, record):
        return [record]


class LosesOnPickle(Suffix):
    name = "loses_on_pickle"

    def spec(self):
        return {"op": self.name}

    def __getstate__(self):
        return {"suffix": ""}


class SpecLostOnPickle(Suffix):
    name = "spec_lost"

    def __getstate__(self):
        return {"suffix": ""}


class Carries(MyShuffle):
    """Carries samples from one window into the next through the class."""

    name = "carries"
    one_to_one = False
    held: list = []

    def apply(self, table, ctx):
        out = z.operators.SampleTable.concat([*Carries.held, table]) if Carries.held else table
        Carries.held[:] = [table.slice(0, min(1, len(table)))]
        return out


class AccDrops(MyShuffle):
    name = "acc_drops"

    def apply(self, table, ctx):
        return table.slice(0, len(table) // 2)


class Unstable(Upper):
    name = "unstable"

    def spec(self):
        return {"op": self.name, "n": next(_CALLS)}


class Tupled(Upper):
    name = "tupled"

    def spec(self):
        return {"op": self.name, "x": (1, 2)}


class HoldsLambda(Upper):
    name = "holds_lambda"

    def __init__(self):
        self.fn = lambda r: r


class Nameless(z.RecordOp):
    def spec(self):
        return {}

    def apply(self, record):
        return [record]


class DoesNothing(z.RecordOp):
    name = "nothing"

    def spec(self):
        return {}


@pytest.fixture(scope="module")
def web(corpus_dir):
    return z.Dataset.from_jsonl("web", str(corpus_dir / "web"), progress=False)


def source(web, seed=1):
    return z.Pipeline(z.MixtureWorkSource([web], chunk_size=12, seed=seed))


def finish(pipe, R=2):
    return pipe.tokenize().pack(64).batch(2).options(canonical_replicas=R, runner="synchronous")


def rows(pipe, n=12):
    with pipe:
        return [batch_rows(b) for b in itertools.islice(pipe, n)]


def test_record_op_gives_the_maps_batches(web):
    assert rows(finish(source(web).add_op(Upper()))) == rows(finish(source(web).map(upper)))


def test_accumulator_gives_the_builtins_batches(web):
    def pipe(op):
        return getattr(source(web).tokenize(), op[0])(*op[1:]).pack(64).batch(2).options(
            canonical_replicas=2, runner="synchronous")
    assert rows(pipe(("add_op", MyShuffle(8)))) == rows(pipe(("shuffle", 8)))


def test_explain_lists_the_operator_with_its_spec(web):
    text = str(finish(source(web).add_op(Suffix("!"))).map_batch(lambda b: b, name="same").explain())
    assert re.search(r"suffix +stateless \(per chunk\)", text) and '"suffix": "!"' in text and "Suffix" in text
    assert "map_batch" in text and "per batch" in text


# -- the door --------------------------------------------------------------------------------


@pytest.mark.parametrize("op,match", [
    (object(), "subclass of zephon_dask.operators.RecordOp"),
    (Nameless(), "name=None"),
    (DoesNothing(), "define apply or apply_chunk"),
    (Unstable(), "differs between two calls"),
    (Tupled(), "not JSON-native"),
    (HoldsLambda(), "does not pickle"),
    (SpecLostOnPickle("!"), "changes after a pickle round trip"),
])
def test_the_door_refuses(web, op, match):
    with pytest.raises(ConfigError, match=match):
        source(web).add_op(op)


def test_a_local_class_is_refused(web):
    class Local(Upper):
        pass

    with pytest.raises(ConfigError, match="define it at module level"):
        source(web).add_op(Local())


@pytest.mark.parametrize("build,match", [
    (lambda p: p.tokenize().pack(64).add_op(Upper()), r"anywhere before \.pack\(\)"),
    (lambda p: p.add_op(EvenTokens()), r"needs token ids.*after \.tokenize"),
    (lambda p: p.add_op(MyShuffle(4)), r"an accumulator sees a window's token samples; it can go after \.tokenize"),
    (lambda p: p.add_op(NoTokensNeeded(4)), r"after \.tokenize"),
    (lambda p: p.tokenize().add_op(CharTokens()), r"in place of \.tokenize\(\)"),
])
def test_a_misplaced_operator_says_where_it_can_go(web, build, match):
    with pytest.raises(ConfigError, match=match):
        build(source(web))


def test_placed_by_traits(web):
    assert rows(finish(source(web)).add_op(MyShuffle(4))) or True  # an accumulator after pack
    tokens = source(web).add_op(CharTokens()).pack(32).batch(2).options(canonical_replicas=2, runner="synchronous")
    assert rows(tokens, 2)
    even = rows(source(web).tokenize().add_op(EvenTokens()).batch(1).options(canonical_replicas=2,
                                                                             runner="synchronous"), 6)
    assert all(len(r) % 2 == 0 for _, _, (r,) in even)


# -- the fingerprint -----------------------------------------------------------------------------


def test_spec_and_code_enter_the_fingerprint(web):
    fp = {name: finish(source(web).add_op(op)).fingerprint()
          for name, op in [("a", Suffix("!")), ("b", Suffix("?")), ("c", Upper()), ("e", Pinned())]}
    assert len(set(fp.values())) == 4
    assert finish(source(web).add_op(Suffix("!"))).fingerprint() == fp["a"]


def test_an_edited_method_changes_the_identity_unless_pinned():
    bases = (z.RecordOp, z.Accumulator)
    old, edited = class_identity(Upper, bases), class_identity(UpperV2, bases)
    assert old["class"] == edited["class"] and old["code"] != edited["code"]
    assert class_identity(Pinned, bases, Pinned.version) == {"class": "tests.unit.test_add_op.Pinned", "version": 3}


def test_a_changed_operator_is_refused_on_resume(web):
    first = finish(source(web).add_op(Suffix("!")))
    rows(first, 3)
    with pytest.raises(StateError, match="suffix"):
        finish(source(web).add_op(Suffix("?"))).load_state_dict(first.state_dict())
    finish(source(web).add_op(Suffix("!"))).load_state_dict(first.state_dict())


# -- validate(): one failing operator per rule ---------------------------------------------------


def test_validate_passes_well_behaved_operators(web):
    pipe = finish(source(web).add_op(Suffix("!")).add_op(Upper())).add_op(MyShuffle(4))
    report = str(pipe.map_batch(lambda b: {**b, "tokens": b["tokens"] + 1}).validate())
    assert "suffix (record operator add_op(Suffix))" in report and "my_shuffle (accumulator" in report
    assert "map_batch" in report


@pytest.mark.parametrize("op,match", [
    (Counter(), "two runs on chunk 0 gave different outputs"),
    (GlobalRandom(), "drew from the global random RNG"),
    (KeepsState(), "the instance changed"),
    (InPlace(), "changed its input in place"),
    (DropsOneToOne(), "one_to_one=True, but it turned"),
    (LosesOnPickle("!"), "a pickled copy"),
])
def test_validate_refuses_a_record_op(web, op, match):
    pipe = finish(source(web).add_op(op))
    with pytest.raises(OperatorContractError, match=match):
        pipe.validate()


def test_validate_refuses_false_makes_tokens(web):
    pipe = source(web).add_op(NoTokens()).batch(2).options(canonical_replicas=2, runner="synchronous")
    with pytest.raises(OperatorContractError, match="makes_tokens=True, but a record"):
        pipe.validate()


@pytest.mark.parametrize("op,match", [
    (Carries(4), "lane 0, window 0 before and after lane 1, window 0 gave different outputs"),
    (AccDrops(4), "one_to_one=True, but it turned"),
])
def test_validate_refuses_an_accumulator(web, op, match):
    Carries.held.clear()
    with pytest.raises(OperatorContractError, match=match):
        finish(source(web)).add_op(op).validate()


def test_validate_refuses_a_batch_function_drawing_from_numpy(web):
    pipe = finish(source(web)).map_batch(lambda b: {**b, "noise": np.random.rand(2)})
    with pytest.raises(OperatorContractError, match="global numpy's RNG"):
        pipe.validate()


# -- map_batch -----------------------------------------------------------------------------------


def test_map_batch_transforms_each_lane_batch(web):
    def shift(b):
        return {**b, "tokens": b["tokens"] + 1, "first": b["tokens"][:, :1].copy()}

    plain = finish(source(web))
    mapped = plain.map_batch(shift, version=1)
    with plain, mapped:
        for a, b in zip(itertools.islice(plain, 10), itertools.islice(mapped, 10), strict=True):
            assert (a.lane, a.index_in_lane) == (b.lane, b.index_in_lane)
            assert np.array_equal(b["tokens"], a["tokens"] + 1) and np.array_equal(b["first"], a["tokens"][:, :1])
    assert mapped.fingerprint() != plain.fingerprint()
    assert plain.map_batch(shift, version=1).fingerprint() == mapped.fingerprint()


def test_map_batch_needs_batch_and_a_dict_back(web):
    with pytest.raises(ConfigError, match=r"call \.batch"):
        source(web).tokenize().map_batch(lambda b: b)
    bad = finish(source(web)).map_batch(lambda b: b["tokens"])
    with pytest.raises(z.errors.OperatorOutputError, match="return a dict of numpy arrays"), bad:
        next(iter(bad))
