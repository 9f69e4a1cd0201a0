"""ensure_mixture, one window at a time, against its slow reference and its promises."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import zephon_dask as z
from tests.helpers.oracles import ref_ensure_mixture
from zephon_dask.errors import ConfigError
from zephon_dask.operators.base import WindowContext
from zephon_dask.operators.mixture import EnsureMixture, dataset_of
from zephon_dask.operators.table import SampleTable

NAMES = ("a", "b", "c")


def window(ds, lengths, no_lineage=()):
    """A window of documents: sample ``i`` of dataset ``ds[i]`` with ``lengths[i]`` tokens, without
    a lineage row for the samples in ``no_lineage``."""
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    tokens = np.arange(offsets[-1], dtype=np.int32) % 97
    rows = [[d, 0, i, 0, n] for i, (d, n) in enumerate(zip(ds, lengths, strict=True)) if i not in no_lineage]
    counts = [0 if i in no_lineage else 1 for i in range(len(ds))]
    return SampleTable(tokens, offsets, np.zeros_like(tokens), np.zeros_like(tokens),
                       np.asarray(rows, np.int64).reshape(-1, 5), np.concatenate(([0], np.cumsum(counts))).astype(np.int64))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), n=st.integers(0, 60), strict=st.booleans(), buffer_size=st.integers(1, 70),
       weight_by=st.sampled_from(["samples", "tokens"]), given_weights=st.booleans())
def test_one_window_matches_the_slow_reference(data, n, strict, buffer_size, weight_by, given_weights):
    ds = data.draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    lengths = data.draw(st.lists(st.integers(1, 9), min_size=n, max_size=n))
    loose = set(data.draw(st.lists(st.integers(0, max(n - 1, 0)), max_size=3))) if n else set()
    table = window(ds, lengths, loose)
    if given_weights:
        weights = data.draw(st.lists(st.integers(0, 5), min_size=3, max_size=3).filter(any))
        op = EnsureMixture(NAMES, dict(zip(NAMES, weights, strict=True)), weight_by=weight_by, strict=strict,
                           buffer_size=buffer_size)
        allocated = None
    else:
        weights = data.draw(st.lists(st.integers(0, 12), min_size=3, max_size=3).filter(any))
        op = EnsureMixture(NAMES, weight_by="samples", strict=strict, buffer_size=buffer_size)
        weight_by = "samples"
        allocated = np.asarray(weights, np.int64)
    ctx = WindowContext(0, 1, 2, NAMES, allocated=allocated)
    out = op.apply(table, ctx)
    labels = dataset_of(table).tolist()
    units = lengths if weight_by == "tokens" else [1] * n
    order = ref_ensure_mixture(labels, units, weights, strict, buffer_size)
    assert out.digest() == table.take(np.asarray(order, np.int64)).digest()
    # the counters: units in and out, samples dropped, per dataset
    for c, name in enumerate(NAMES):
        mine = [i for i in range(n) if labels[i] == c]
        assert ctx.stats[f"ensure_mixture.{name}.in"] == sum(units[i] for i in mine)
        assert ctx.stats[f"ensure_mixture.{name}.out"] == sum(units[i] for i in order if labels[i] == c)
        assert ctx.stats[f"ensure_mixture.{name}.dropped"] == len([i for i in mine if i not in order])
    if not strict:
        assert sorted(order) == list(range(n))  # only reordered
    else:  # each dataset within one sample's units of its share of T, so of the delivered total
        got = [sum(units[i] for i in order if labels[i] == c) for c in range(3)]
        total = Fraction(sum(got))
        shares = [Fraction(w, sum(weights)) for w in weights]
        if total:
            assert all(abs(g - total * s) <= 3 * max(units) for g, s in zip(got, shares, strict=True))


def test_strict_restores_a_filtered_half_and_non_strict_only_reorders():
    ds = [0, 1] * 40
    table = window(ds, [3] * 80)
    keep = [i for i in range(80) if ds[i] == 0 or i % 8 == 1]  # 3 of 4 of b dropped upstream
    table = table.take(np.asarray(keep))
    strict = EnsureMixture(("a", "b"), strict=True).apply(table, WindowContext(0, 0, 0, ("a", "b"),
                                                                              allocated=np.array([40, 40])))
    labels = dataset_of(strict).tolist()
    assert labels == [0, 1] * 10  # 10 of each, alternating
    loose = EnsureMixture(("a", "b"), buffer_size=4).apply(table, WindowContext(0, 0, 0, ("a", "b")))
    assert sorted(dataset_of(loose).tolist()) == sorted(dataset_of(table).tolist())


def test_settings_are_checked_at_the_door_and_enter_the_fingerprint():
    web = z.Dataset.from_records("web", {"s": [{"text": f"w{i}"} for i in range(20)]})
    code = z.Dataset.from_records("code", {"s": [{"text": f"c{i}"} for i in range(20)]})
    base = z.Pipeline(z.MixtureWorkSource([web, code], chunk_size=4)).tokenize()
    prints = {base.ensure_mixture(**kw).spec.fingerprint for kw in (
        {}, {"strict": True}, {"buffer_size": 8}, {"weights": {"web": 1}}, {"weights": {"web": 1, "code": 3}})}
    assert len(prints) == 5
    # warn_tolerance only warns: not a data setting
    assert base.ensure_mixture(warn_tolerance=0.1).spec.fingerprint == base.ensure_mixture().spec.fingerprint
    # 0.1 + 0.2 given as floats is read by their decimal text: exact
    assert base.ensure_mixture(weights={"web": 0.1, "code": 0.2}).spec.fingerprint == \
        base.ensure_mixture(weights={"web": 1, "code": 2}).spec.fingerprint
    for kw, match in [({"weights": {"prose": 1}}, "prose"), ({"weights": {"web": -1}}, "number >= 0"),
                      ({"weights": {"web": 0}}, "all 0"), ({"weight_by": "bytes"}, "weight_by"),
                      ({"weight_by": "tokens"}, "weights="), ({"buffer_size": 0}, "buffer_size"),
                      ({"warn_tolerance": 2}, "warn_tolerance"), ({"strict": "yes"}, "strict")]:
        with pytest.raises(ConfigError, match=match):
            base.ensure_mixture(**kw)
    by_tokens = z.Pipeline(z.MixtureWorkSource([web, code], {"web": 1, "code": 3}, chunk_size=4,
                                               weight_by="tokens", tokens_per_sample={"web": 4, "code": 4}))
    assert by_tokens.tokenize().ensure_mixture(weight_by="tokens").spec.accumulators[0].spec()["weights"] == \
        {"web": "1/4", "code": "3/4"}  # the source's token weights
    with pytest.raises(ConfigError, match="before .pack"):
        base.pack(16).ensure_mixture()
    with pytest.raises(ConfigError, match="once"):
        base.ensure_mixture().ensure_mixture()
    with pytest.raises(ConfigError, match="tokenize"):
        z.Pipeline(z.MixtureWorkSource([web, code], chunk_size=4)).ensure_mixture()
