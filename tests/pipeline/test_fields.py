"""Kept fields (``tokenize(keep=)``) and ``batch(dataset_ids=True)`` through whole runs.

The truth is twofold: each token's values equal its source record's (read back by the token's
lineage row, whose token counts lay the row's tokens out), and every delivered batch, fields
included, equals the uninterrupted single-rank run's batch of the same ``(lane, index_in_lane)``,
under any runner, resumed at any cut on another dp degree, and through DataLoader workers.
"""

from __future__ import annotations

import functools
import json
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import zephon_dask as z
from tests.helpers.pipelines import WORDS
from zephon_dask.errors import ConfigError, FieldTypeError, MissingFieldError

FIELDS = ("domain", "score", "flag")


def write(root, name, files, docs, seed, bad=None):
    rng = random.Random(seed)
    (root / name).mkdir(parents=True, exist_ok=True)
    for f in range(files):
        with open(root / name / f"part-{f}.jsonl", "w") as fh:
            for i in range(docs):
                record = {"text": f"{name} {f}/{i} " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 40))),
                          "domain": rng.randint(0, 3), "score": rng.random(), "flag": rng.random() < 0.5}
                if bad is not None and i == 3:
                    record = bad(record)
                fh.write(json.dumps(record) + "\n")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("fields")
    write(root, "web", 2, 30, 1)
    write(root, "code", 1, 25, 2)
    return root


def datasets(root):
    return [z.Dataset.from_jsonl(n, str(root / n), progress=False) for n in ("web", "code")]


def pipe(root, algorithm="best_fit", microbatch=2, dp=1, group=0, runner="synchronous", pack=None,
         drop_last=True, **options):
    ws = z.MixtureWorkSource(datasets(root), {"web": 2, "code": 1}, chunk_size=6, seed=3)
    p = z.Pipeline(ws).tokenize(keep=list(FIELDS)).shuffle(8).pack(64, algorithm=algorithm, **(pack or {}))
    options.setdefault("drop_last_step", False)  # every sample: groups in one process end the stream alike
    return p.batch(microbatch, dataset_ids=True, drop_last=drop_last).options(
        canonical_replicas=4, flush_every_k_chunks=1, runner=runner, dp_degree=dp, dp_group_id=group,
        batches_per_step=8 // microbatch // dp, **options)


def content(batch) -> tuple:
    """A batch's rows, per-token fields and dataset ids, padding stripped, keyed by lane and index."""
    real = np.asarray(batch["document_ids"]) >= 0
    rows = tuple(tuple(np.asarray(batch[k])[i][real[i]].tolist() for k in ("tokens", "dataset_ids", *FIELDS))
                 for i in range(len(real)))
    return (int(batch["lane"] if "lane" in batch else batch.lane),
            int(batch["index_in_lane"] if "index_in_lane" in batch else batch.index_in_lane)), rows




@pytest.mark.parametrize("algorithm", ["wrap", "first_fit", "best_fit", "best_fit_wrap"])
def test_each_token_carries_its_source_records_values_and_dataset(corpus, algorithm):
    sources = datasets(corpus)
    seen = 0
    with pipe(corpus, algorithm, pack={"shuffle_bins": True}) as p:
        for batch in p:
            for i in range(batch.num_samples):
                expected = {k: [] for k in ("dataset_ids", *FIELDS)}
                for d, shard, offset, _, count in batch.lineage[i].tolist():
                    (record,) = sources[d].read(shard, np.array([offset]))
                    expected["dataset_ids"] += [d] * count
                    for k in FIELDS:
                        expected[k] += [record[k]] * count
                for k, values in expected.items():
                    got, n = batch[k][i], len(values)  # padding after the real tokens
                    assert got[:n].tolist() == pytest.approx(np.asarray(values, got.dtype).tolist()), k
                    pad = got[n:]
                    assert (np.isnan(pad).all() if got.dtype.kind == "f" else (pad == (False if got.dtype == bool
                                                                                       else -1)).all()), k
                seen += n
            assert (batch["domain"].dtype, batch["score"].dtype, batch["flag"].dtype, batch["dataset_ids"].dtype) == \
                (np.int64, np.float32, np.bool_, np.int64)
    assert seen > 100


@functools.cache
def single_rank(corpus, algorithm, microbatch, groups) -> dict:
    with pipe(corpus, algorithm, microbatch, pack={"groups": "domain"} if groups else None) as p:
        return dict(content(b) for b in p)


@pytest.mark.filterwarnings("ignore:state_dict\\(\\) taken")  # cuts inside a step are part of the test
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(algorithm=st.sampled_from(["wrap", "best_fit"]), before=st.sampled_from([1, 2, 4]),
       after=st.sampled_from([1, 2, 4]), runner=st.sampled_from(["synchronous", "threads"]),
       cut=st.integers(0, 12), microbatch=st.sampled_from([1, 2]), groups=st.booleans())
def test_resumes_at_any_cut_on_another_dp_degree_equal_the_single_rank_run(corpus, algorithm, before, after,
                                                                           runner, cut, microbatch, groups):
    whole = single_rank(corpus, algorithm, microbatch, groups)
    pack = {"groups": "domain"} if groups else None
    got = []
    ranks = [pipe(corpus, algorithm, microbatch, before, g, runner, pack=pack) for g in range(before)]
    for p in ranks:
        it = iter(p)
        got += [content(b) for _, b in zip(range(cut), it, strict=False)]
    state = z.merge_states([p.state_dict() for p in ranks])
    for p in ranks:
        p.close()
    for g in range(after):
        with pipe(corpus, algorithm, microbatch, after, g, runner, pack=pack).load_state_dict(state) as p:
            got += [content(b) for b in p]
    assert dict(got) == whole and len(got) == len(whole)  # each batch as the single-rank run's, once


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_workers_deliver_the_same_fields(corpus, workers):
    whole = dict(single_rank(corpus, "best_fit", 2, False))
    with pipe(corpus, runner="threads") as p:
        for t in p.to_torch_loader(num_workers=workers):
            key, rows = content({k: v.numpy() for k, v in t.items()})
            assert rows == whole.pop(key)
            assert str(t["score"].dtype) == "torch.float32" and str(t["flag"].dtype) == "torch.bool"
    assert not whole


def test_a_missing_or_non_numeric_field_is_named_with_its_record(tmp_path):
    for bad, error, shown in ((lambda r: {k: v for k, v in r.items() if k != "domain"}, MissingFieldError,
                               "no field 'domain'"),
                              (lambda r: {**r, "domain": "news"}, FieldTypeError, "kept field 'domain' is str")):
        root = tmp_path / error.__name__
        write(root, "web", 1, 8, 1, bad)
        write(root, "code", 1, 8, 2)
        with pytest.raises(error, match=shown) as info, pipe(root) as p:
            list(p)
        assert "offset 3" in str(info.value)


def test_keep_and_groups_are_checked_at_the_door(corpus):
    ws = z.MixtureWorkSource(datasets(corpus), {"web": 2, "code": 1}, chunk_size=6, seed=3)
    with pytest.raises(ConfigError, match="a batch already has 'labels'"):
        z.Pipeline(ws).tokenize(keep=["labels"])
    with pytest.raises(ConfigError, match="list of field names"):
        z.Pipeline(ws).tokenize(keep="domain")
    with pytest.raises(ConfigError, match="one of"):
        z.Pipeline(ws).tokenize(keep={"domain": "int8"})
    with pytest.raises(ConfigError, match=r"keep=\['domain'\]"):
        z.Pipeline(ws).tokenize().pack(64, groups="domain")
    plain = z.Pipeline(ws).tokenize().pack(64).batch(2)
    kept = z.Pipeline(ws).tokenize(keep=["domain"]).pack(64).batch(2)
    assert "keep" not in json.dumps(plain.spec.fingerprint) and plain.spec.fingerprint != kept.spec.fingerprint
    ids = z.Pipeline(ws).tokenize().pack(64).batch(2, dataset_ids=True)
    assert ids.spec.fingerprint == plain.spec.fingerprint  # a view of the same samples, like labels
    assert "per-token fields" in str(kept.explain()) and "dataset_ids (0=web, 1=code)" in str(ids.explain())


def test_the_distributed_runner_delivers_the_same_fields(corpus):
    """Windows computed in worker processes (pickled, held narrowed) give the same batches."""
    with pipe(corpus, runner="distributed", n_workers=1) as p:
        got = dict(content(b) for b in p)
    assert got == single_rank(corpus, "best_fit", 2, False)


def test_stats_count_the_documents_pack_dropped_and_the_rows_per_group(corpus):
    options = {"groups": "domain", "drop_oversized": True, "min_sequence_length": 40}
    with pipe(corpus, "first_fit", pack=options) as p:
        batches = list(p)
        stats = p.stats()
    assert stats.counters["pack.oversized_documents"] > 0 and stats.counters["pack.short_documents"] > 0
    groups = {k: v for k, v in stats.counters.items() if k.startswith("pack.group_rows.")}
    assert set(groups) <= {f"pack.group_rows.{d}" for d in range(4)} and sum(groups.values()) == stats.counters[
        "pack.rows"]
    assert all(len(set(row[2])) == 1 for b in batches for row in content(b)[1] if row[2])  # one domain a row
    assert "packed rows per group" in str(stats) and "over max_length (dropped)" in str(stats)


def test_a_field_int_in_one_chunk_and_float_in_another_asks_for_its_type(tmp_path):
    write(tmp_path, "web", 1, 12, 1, lambda r: {**r, "domain": 0.5})
    write(tmp_path, "code", 1, 12, 2)
    ws = z.MixtureWorkSource(datasets(tmp_path), {"web": 1, "code": 1}, chunk_size=4, seed=0)
    mixed = z.Pipeline(ws).tokenize(keep=["domain"]).pack(64).batch(1).options(runner="synchronous",
                                                                                drop_last_step=False)
    with pytest.raises(FieldTypeError, match="give its type"), mixed:
        list(mixed)
    fixed = z.Pipeline(ws).tokenize(keep={"domain": "float32"}).pack(64).batch(1).options(runner="synchronous",
                                                                                       drop_last_step=False)
    with fixed:
        assert all(b["domain"].dtype == np.float32 for b in fixed)


def lane_rows(batches) -> dict:
    """Per lane, its rows (with their fields) in delivery order, whatever the batches' sizes."""
    out: dict = {}
    for (lane, _), rows in batches:
        out.setdefault(lane, []).extend(rows)
    return out


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(before=st.sampled_from([(1, 1), (2, 2), (1, 2)]), after=st.sampled_from([(1, 1), (2, 2), (4, 1)]),
       steps=st.integers(0, 4))
def test_a_resume_with_another_microbatch_and_dp_gives_each_lane_the_same_rows(corpus, before, after, steps):
    """``(dp, microbatch)`` before and after a checkpoint at a step boundary: each lane's rows and their
    fields, in order, as in the single-rank run with microbatch 1."""
    truth = lane_rows(single_rank(corpus, "best_fit", 1, False).items())
    got = []
    (dp, mb), (dp2, mb2) = before, after
    ranks = [pipe(corpus, microbatch=mb, dp=dp, group=g, drop_last=False) for g in range(dp)]
    for p in ranks:
        it = iter(p)
        got += [content(b) for _, b in zip(range(steps * (8 // mb // dp)), it, strict=False)]
    state = z.merge_states([p.state_dict() for p in ranks])
    for p in ranks:
        p.close()
    for g in range(dp2):
        with pipe(corpus, microbatch=mb2, dp=dp2, group=g, drop_last=False).load_state_dict(state) as p:
            got += [content(b) for b in p]
    assert lane_rows(got) == truth
