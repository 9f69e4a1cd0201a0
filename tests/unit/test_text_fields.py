"""Each dataset's ``text_field`` is what ``tokenize()`` reads unless ``field=`` says otherwise: datasets
whose text lies in different fields mix with no ``map``, in Python and in a recipe."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import zephon_dask as z
from zephon_dask.errors import MissingFieldError


def mixture(datasets, **tokenize):
    ws = z.MixtureWorkSource(datasets, chunk_size=4, seed=3)
    return (z.Pipeline(ws).tokenize(**tokenize).pack(16, algorithm="first_fit").batch(2)
            .options(canonical_replicas=2, runner="synchronous", drop_last_step=False))  # every row: tiny texts


def token_rows(pipeline) -> list[np.ndarray]:
    with pipeline:
        return [np.asarray(b["tokens"]) for b in pipeline]


texts = st.lists(st.text(st.characters(codec="utf-8"), min_size=1, max_size=12), min_size=3, max_size=12)


@settings(max_examples=8, deadline=None)
@given(news=texts, web=texts, field=st.sampled_from(["content", "body", "text"]))
def test_per_dataset_fields_tokenize_as_if_every_text_were_in_text(news, web, field):
    """Oracle: the same texts all under "text" (the default field for everyone)."""
    mixed = mixture([z.Dataset.from_records("news", [{field: t, "n": 1} for t in news], text_field=field),
                     z.Dataset.from_records("web", [{"text": t} for t in web])])
    plain = mixture([z.Dataset.from_records("news", [{"text": t, "n": 1} for t in news]),
                     z.Dataset.from_records("web", [{"text": t} for t in web])])
    got, want = token_rows(mixed), token_rows(plain)
    assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want))


def test_the_spec_names_each_datasets_field_only_when_they_differ():
    web = z.Dataset.from_records("web", [{"text": "a b"}] * 4)
    news = z.Dataset.from_records("news", [{"content": "c d", "text": 1}] * 4, text_field="content")
    same = mixture([web, z.Dataset.from_records("code", [{"text": "x"}] * 4)])
    assert same.description.record_ops[0].spec()["field"] == "text"  # as before: a single field
    assert mixture([web, z.Dataset.from_records("code", [{"text": "x"}] * 4)], field="text").spec.fingerprint \
        == same.spec.fingerprint
    both = mixture([web, news])
    assert both.description.record_ops[0].spec()["field"] == {"web": "text", "news": "content"}
    assert both.spec.fingerprint != mixture([web, news], field="text").spec.fingerprint
    # field= says otherwise for every dataset: news's "text" is an int, a FieldTypeError at run time
    with pytest.raises(MissingFieldError, match="'web'.*'content'"):
        mixture([web, news], field="content")


def test_a_recipe_mixes_datasets_whose_text_fields_differ(tmp_path):
    (tmp_path / "news.jsonl").write_text("".join(json.dumps({"content": f"news {i}"}) + "\n" for i in range(9)))
    (tmp_path / "web.jsonl").write_text("".join(json.dumps({"text": f"web {i}"}) + "\n" for i in range(9)))
    (tmp_path / "recipe.toml").write_text(
        '[[datasets]]\nname = "news"\npath = "news.jsonl"\ntext_field = "content"\n\n'
        '[[datasets]]\nname = "web"\npath = "web.jsonl"\n\n'
        '[source]\nchunk_size = 6\n\n[tokenize]\n\n[pack]\nmax_length = 8\n\n[batch]\nmicrobatch_size = 2\n'
        '\n[options]\ncanonical_replicas = 1\nrunner = "synchronous"\n')
    pipeline = z.Pipeline.from_config(tmp_path / "recipe.toml")
    text = b"".join(bytes(r[r < 256].astype(np.uint8)) for r in token_rows(pipeline)).decode()
    assert "news" in text and "web" in text
