"""The mistakes of a first hour, refused at the door with the fix: a misspelled keyword of a builder
method ("did you mean"), a device this torch cannot use, a bad ``ZEPHON_DASK_LOG``; and what a
newcomer expects to work: ``from_parquet`` with a list, ``explain().section`` by prefix, as text."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import zephon_dask as z
from zephon_dask.errors import ConfigError, DeviceUnavailableError, NotFoundError, ZephonError
from zephon_dask.inspect.explain import Explanation, Section


def pipeline():
    ds = z.Dataset.from_records("docs", [{"text": f"doc {i}"} for i in range(8)])
    return z.Pipeline(z.MixtureWorkSource([ds], chunk_size=4, seed=0)).options(canonical_replicas=1)


@pytest.mark.parametrize("call, wrong, right", [
    (lambda p, kw: p.tokenize().pack(8).batch(4, **kw), "label", "labels"),
    (lambda p, kw: p.tokenize(**kw), "max_len", "max_length"),
    (lambda p, kw: p.tokenize().shuffle(8, **kw), "sed", "seed"),
    (lambda p, kw: p.tokenize().pack(8, **kw), "algoritm", "algorithm"),
    (lambda p, kw: p.map(lambda r: r, **kw), "nam", "name"),
    (lambda p, kw: z.Dataset.from_jsonl("web", "examples/data/prose.jsonl", **kw), "textfield", "text_field"),
    (lambda p, kw: z.Dataset.from_records("web", ["a"], **kw), "text_feild", "text_field"),
    (lambda p, kw: z.MixtureWorkSource([], **kw), "chunksize", "chunk_size"),
])
def test_a_misspelled_keyword_is_a_config_error_naming_the_right_one(call, wrong, right):
    with pytest.raises(ConfigError) as info:
        call(pipeline(), {wrong: True})
    assert isinstance(info.value, ZephonError) and isinstance(info.value, TypeError)  # as Python's was
    assert f"has no argument {wrong!r}; did you mean {right!r}?" in str(info.value)


def test_every_public_builder_method_checks_its_keywords_and_keeps_its_signature():
    for name, fn in vars(z.Pipeline).items():
        if name.startswith("_") or not inspect.isfunction(fn):
            continue
        if not inspect.unwrap(fn).__code__.co_flags & inspect.CO_VARKEYWORDS:
            assert hasattr(fn, "__wrapped__"), name
            assert inspect.signature(fn) == inspect.signature(fn.__wrapped__), name
    with pytest.raises(ConfigError, match="did you mean 'canonical_replicas'"):
        pipeline().options(canonical_replica=2)  # options(**settings) checks its own names


@pytest.mark.skipif(torch.backends.mps.is_available(), reason="this torch can use mps")
def test_a_device_this_torch_cannot_use_fails_when_asked_not_at_the_first_batch():
    p = pipeline().tokenize().pack(8).batch(1).options(runner="synchronous")
    with pytest.raises(DeviceUnavailableError, match=r"to_torch\(device='mps'\).*device='cpu'"):
        p.to_torch(device="mps")
    assert next(iter(p.to_torch(device="cpu")))["tokens"].device.type == "cpu"


def test_from_parquet_reads_a_list_of_files(tmp_path):
    for folder, texts in (("a", ["x", "y"]), ("b", ["z"])):
        (tmp_path / folder).mkdir()
        pq.write_table(pa.table({"text": texts}), tmp_path / folder / "part.parquet")
    paths = [str(tmp_path / "b" / "part.parquet"), str(tmp_path / "a" / "part.parquet")]
    ds = z.Dataset.from_parquet("wiki", paths, progress=False)
    assert ds.num_samples == 3 and ds.num_shards == 2
    assert sorted(r["text"] for i in range(2) for r in ds.read(i, range(ds.shard_sizes[i]))) == ["x", "y", "z"]
    assert z.Dataset.from_parquet("wiki", paths[::-1], progress=False).identity() == ds.identity()
    with pytest.raises(ConfigError, match="empty list"):
        z.Dataset.from_parquet("wiki", [], progress=False)


def test_a_bad_log_variable_is_named():
    env = {**os.environ, "ZEPHON_DASK_LOG": "verbose"}
    out = subprocess.run([sys.executable, "-c", "import zephon_dask.log"], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode != 0 and "ZEPHON_DASK_LOG='verbose'" in out.stderr and "INFO" in out.stderr


def test_explain_sections_are_found_by_prefix_and_print_as_text():
    e = pipeline().tokenize().pack(8).batch(1).explain()
    section = e.section("exec")
    assert section.title.startswith("execution") and e.section("EXECUTION") is section
    assert str(section) == repr(section) == section.text() and "Section(" not in str(section)
    with pytest.raises(NotFoundError, match="no section starts with 'nope'"):
        e.section("nope")
    two = Explanation("ab" * 8, (Section("lanes"), Section("lanes and windows")), ())
    assert two.section("lanes").title == "lanes"  # a whole title wins over a longer one it starts
    with pytest.raises(NotFoundError, match="several sections start with 'lan'"):
        two.section("lan")


def small_corpus(**source):
    ds = z.Dataset.from_records("notes", [{"text": "word " * 40}] * 700)
    return (z.Pipeline(z.MixtureWorkSource([ds], **source)).tokenize().pack(128).batch(4)
            .options(runner="synchronous"))


def test_a_corpus_too_small_for_its_lanes_says_so_with_the_chunk_size_that_fits():
    import warnings

    from zephon_dask.errors import ElasticityWarning, EmptyStreamError

    pipe = small_corpus(chunk_size=1024)  # 700 documents, chunk_size 1,024 given, 8 lanes: one chunk
    (note,) = [w for w in pipe.explain().warnings if "lanes get no chunk" in w]
    assert "7 lanes get no chunk" in note and "chunk_size=64" in note
    with pytest.raises(EmptyStreamError, match="no whole global step .*chunk_size=64"), pipe:
        list(pipe)  # whole steps (drop_last_step): the 7 lanes without a chunk complete none
    every = small_corpus(chunk_size=1024).options(drop_last_step=False)
    with pytest.warns(ElasticityWarning, match="chunk_size=64"), every:
        assert len({b.lane for b in every}) == 1
    fitted = small_corpus(chunk_size=64)  # the fix it names: every lane gets work
    assert not any("lanes get no chunk" in w for w in fitted.explain().warnings)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ElasticityWarning)
        with fitted:
            assert {b.lane for b in fitted} == set(range(8))
