"""TOML recipes: round trip against a hand-built pipeline, path resolution, and every load error."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import fsspec
import pytest

import zephon_dask as z
from zephon_dask.errors import (
    ConfigError,
    RecipeError,
    RecipeKeyError,
    RecipePathError,
    RecipeTypeError,
    ZephonError,
)
from zephon_dask.recipe import TABLES, DatasetEntry, load_recipe

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "recipe.toml"

BASE = """
[[datasets]]
name = "prose"
path = "data/prose.jsonl"
weight = 2

[[datasets]]
name = "code"
path = "data/code"
format = "jsonl"
text_field = "text"
weight = 1

[source]
chunk_size = 6
seed = 7
shuffle_shards = false

[tokenize]
tokenizer = "bytes"
bos = true

[shuffle]
buffer_size = 5

[pack]
max_length = 48
algorithm = "first_fit"
num_bins = 4

[batch]
microbatch_size = 2
labels = true

[options]
canonical_replicas = 2
flush_every_k_chunks = 3
runner = "synchronous"
prefetch_windows = 1
"""


def write_jsonl(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


@pytest.fixture
def corpus(tmp_path):
    write_jsonl(tmp_path / "data" / "prose.jsonl", [{"text": f"prose line {i} " * (i % 4 + 1)} for i in range(30)])
    for s in range(2):
        write_jsonl(tmp_path / "data" / "code" / f"part-{s}.jsonl",
                    [{"text": f"def f{s}_{i}(): return {i}"} for i in range(12)])
    return tmp_path


def recipe(folder: Path, text: str, name: str = "recipe.toml") -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def hand_built(folder: Path) -> z.Pipeline:
    prose = z.Dataset.from_jsonl("prose", folder / "data" / "prose.jsonl")
    code = z.Dataset.from_jsonl("code", folder / "data" / "code", text_field="text")
    source = z.MixtureWorkSource([prose, code], {"prose": 2, "code": 1}, chunk_size=6, seed=7,
                                 shuffle_shards=False)
    return (z.Pipeline(source).tokenize("bytes", bos=True).shuffle(5)
            .pack(48, algorithm="first_fit", num_bins=4).batch(2, labels=True)
            .options(canonical_replicas=2, flush_every_k_chunks=3, runner="synchronous", prefetch_windows=1))


def test_recipe_and_hand_built_pipeline_agree(corpus):
    p = z.Pipeline.from_config(recipe(corpus, BASE))
    q = hand_built(corpus)
    assert p.fingerprint() == q.fingerprint()
    assert p.batch_options == q.batch_options
    assert p.settings == q.settings
    assert p.compute_window(1, 0).digest() == q.compute_window(1, 0).digest()


def test_paths_are_relative_to_the_recipe_folder_not_the_cwd(corpus, tmp_path, monkeypatch):
    path = recipe(corpus, BASE)
    monkeypatch.chdir(tmp_path.parent)
    r = load_recipe(path)
    assert r.datasets[0].path == str(corpus / "data" / "prose.jsonl")
    assert r.datasets[1] == DatasetEntry("code", str(corpus / "data" / "code"), "jsonl", "text", 1)
    assert r.weights == {"prose": 2, "code": 1}
    assert r.pipeline().work_source.names == ("prose", "code")


def test_urls_are_used_as_written(tmp_path):
    fs = fsspec.filesystem("memory")
    with fs.open("/zephon-recipe-test/web.jsonl", "w") as fh:
        fh.write("".join(json.dumps({"text": f"web {i}"}) + "\n" for i in range(20)))
    path = recipe(tmp_path, """
        [[datasets]]
        name = "web"
        path = "memory://zephon-recipe-test/web.jsonl"
        [source]
        chunk_size = 4
        [options]
        canonical_replicas = 2
    """)
    r = load_recipe(path)
    assert r.datasets[0].path == "memory://zephon-recipe-test/web.jsonl"
    assert r.weights is None
    assert len(r.pipeline().work_source) == 5


def test_hf_tokenizer_path_is_resolved_against_the_recipe(corpus):
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"[UNK]": 0, "<|endoftext|>": 1, "prose": 2, "line": 3}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    (corpus / "tok").mkdir()
    tok.save(str(corpus / "tok" / "tokenizer.json"))
    text = BASE.replace('tokenizer = "bytes"\nbos = true', 'tokenizer = "tok/tokenizer.json"')
    r = load_recipe(recipe(corpus, text))
    assert r.tokenize["tokenizer"] == str(corpus / "tok" / "tokenizer.json")
    p = r.pipeline()
    assert p.spec.record_ops[0].spec()["tokenizer"]["kind"] == "huggingface"
    pv = p.preview(n=3)
    assert "huggingface" in pv.decoder
    assert any("prose line" in d.text for row in pv.rows for d in row.documents)


def test_the_example_recipe_builds():
    p = z.Pipeline.from_config(EXAMPLE)
    assert p.work_source.names == ("prose", "code")
    assert [d.num_samples for d in p.work_source.datasets] == [50, 50]
    assert "pack" in str(p.explain())


def test_recipe_tables_match_the_python_signatures():
    import inspect

    methods = {"source": z.MixtureWorkSource.__init__, "tokenize": z.Pipeline.tokenize,
               "shuffle": z.Pipeline.shuffle, "pack": z.Pipeline.pack, "batch": z.Pipeline.batch}
    for table, keys in TABLES.items():
        params = set(inspect.signature(methods[table]).parameters)
        assert set(keys) <= params, table


# -- errors --------------------------------------------------------------------------------

ERRORS = [
    # (edit of BASE, error type, built-in it also is, fragments the message names)
    ("\n[extra]\nx = 1\n", RecipeKeyError, ValueError, ["'extra'", "known"]),
    ("\nseed = 1\n", RecipeKeyError, ValueError, ["'seed'"]),
    (("chunk_size = 6", "chunksize = 6"), RecipeKeyError, ValueError, ["[source]", "'chunksize'", "did you mean 'chunk_size'"]),
    (('text_field = "text"', 'textfield = "text"'), RecipeKeyError, ValueError, ["[[datasets]] #2", "'textfield'"]),
    (("chunk_size = 6", 'chunk_size = "6"'), RecipeTypeError, TypeError, ["[source]", "chunk_size = '6'", "an integer"]),
    (("seed = 7", "seed = true"), RecipeTypeError, TypeError, ["seed = True", "an integer"]),
    (("weight = 2", 'weight = "2"'), RecipeTypeError, TypeError, ["weight = '2'", "a number"]),
    (("bos = true", "bos = 1"), RecipeTypeError, TypeError, ["[tokenize]", "bos = 1", "true or false"]),
    (("microbatch_size = 2", "microbatch_size = 2.5"), RecipeTypeError, TypeError, ["[batch]", "microbatch_size = 2.5"]),
    (("runner = \"synchronous\"", "runner = 3"), RecipeTypeError, TypeError, ["[options]", "runner = 3", "a string"]),
    (("max_length = 48", "maxlen = 48"), RecipeKeyError, ValueError, ["[pack]", "'maxlen'"]),
    (("buffer_size = 5", "seed = 5"), RecipeKeyError, ValueError, ["[shuffle]", "lacks", "'buffer_size'"]),
    (('name = "prose"\n', ""), RecipeKeyError, ValueError, ["[[datasets]] #1", "lacks", "'name'"]),
    (('path = "data/prose.jsonl"', 'path = "data/missing.jsonl"'), RecipePathError, FileNotFoundError,
     ["[[datasets]] #1", "path = 'data/missing.jsonl'", "missing.jsonl", "recipe's folder"]),
    (('path = "data/code"', 'path = "data/nothing/*.jsonl"'), RecipePathError, FileNotFoundError, ["*.jsonl"]),
    (('tokenizer = "bytes"', 'tokenizer = "tok.json"'), RecipePathError, FileNotFoundError, ["[tokenize]", "tokenizer = 'tok.json'"]),
    (('format = "jsonl"', 'format = "csv"'), RecipeError, ValueError, ["format = 'csv'", "'jsonl'"]),
    (('format = "jsonl"', 'format = "tokens"'), RecipeKeyError, ValueError, ["text_field", "token store"]),
    (('name = "code"', 'name = "prose"'), RecipeError, ValueError, ["[[datasets]] #2", "'prose'", "unique"]),
    (("weight = 1\n", ""), RecipeKeyError, ValueError, ["['code']", "weight"]),
    (("prefetch_windows = 1", "prefetch = 1"), RecipeKeyError, ValueError, ["[options]", "'prefetch'", "did you mean 'prefetch_windows'"]),
    (("prefetch_windows = 1", 'client = "x"'), RecipeKeyError, ValueError, ["client", "address"]),
    (("[source]", "[source\n"), RecipeError, ValueError, ["not valid TOML"]),
]


@pytest.mark.parametrize(("edit", "error", "builtin", "fragments"), ERRORS)
def test_recipe_errors_name_the_file_key_value_and_fix(corpus, edit, error, builtin, fragments):
    text = BASE + edit if isinstance(edit, str) else BASE.replace(*edit, 1)
    assert text != BASE
    path = recipe(corpus, text)
    with pytest.raises(error) as info:
        load_recipe(path)
    assert isinstance(info.value, ZephonError) and isinstance(info.value, builtin)
    message = str(info.value)
    assert str(path) in message
    for fragment in fragments:
        assert fragment in message


def test_tables_must_be_tables(corpus):
    path = recipe(corpus, "shuffle = 3\n" + BASE.replace("[shuffle]\nbuffer_size = 5\n", ""))
    with pytest.raises(RecipeTypeError, match="shuffle = 3 must be a table"):
        load_recipe(path)


def test_datasets_must_be_an_array_of_tables(corpus):
    path = recipe(corpus, '[datasets]\nname = "x"\npath = "data/prose.jsonl"\n')
    with pytest.raises(RecipeTypeError, match=r"\[\[datasets\]\] \(two brackets\)"):
        load_recipe(path)
    with pytest.raises(RecipeKeyError, match="no \\[\\[datasets\\]\\]"):
        load_recipe(recipe(corpus, "[source]\nchunk_size = 4\n"))


def test_missing_recipe_file(tmp_path):
    with pytest.raises(RecipePathError, match="does not exist") as info:
        load_recipe(tmp_path / "nope.toml")
    assert isinstance(info.value, FileNotFoundError)


def test_bad_values_fail_at_build_with_a_note_naming_the_recipe_table(corpus):
    r = load_recipe(recipe(corpus, BASE.replace('algorithm = "first_fit"', 'algorithm = "tetris"')))
    with pytest.raises(ConfigError, match="tetris") as info:
        r.pipeline()
    assert any(str(r.path) in note and "[pack]" in note for note in info.value.__notes__)
