"""TOML recipes: round trip against a hand-built pipeline, path resolution, and every load error."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import fsspec
import pytest

import zephon_dask as z
from zephon_dask import compute_window
from zephon_dask.errors import (
    ConfigError,
    RecipeError,
    RecipeKeyError,
    RecipePathError,
    RecipeTypeError,
    ZephonError,
)
from zephon_dask.recipe import TABLES, DatasetEntry, load_recipe

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "recipe.toml"

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

[ensure_mixture]
strict = true
buffer_size = 7

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
    return (z.Pipeline(source).tokenize("bytes", bos=True).shuffle(5).ensure_mixture(strict=True, buffer_size=7)
            .pack(48, algorithm="first_fit", num_bins=4).batch(2, labels=True)
            .options(canonical_replicas=2, flush_every_k_chunks=3, runner="synchronous", prefetch_windows=1))


def test_recipe_and_hand_built_pipeline_agree(corpus):
    p = z.Pipeline.from_config(recipe(corpus, BASE))
    q = hand_built(corpus)
    assert p.fingerprint() == q.fingerprint()
    assert p.description.batch == q.description.batch
    assert p.description.settings == q.description.settings
    assert compute_window(p.spec, 1, 0).digest() == compute_window(q.spec, 1, 0).digest()


def test_paths_are_relative_to_the_recipe_folder_not_the_cwd(corpus, tmp_path, monkeypatch):
    path = recipe(corpus, BASE)
    monkeypatch.chdir(tmp_path.parent)
    r = load_recipe(path)
    assert r.datasets[0].path == str(corpus / "data" / "prose.jsonl")
    assert r.datasets[1] == DatasetEntry("code", str(corpus / "data" / "code"), "jsonl", "text", 1)
    assert r.weights == {"prose": 2, "code": 1}
    assert z.Pipeline.from_config(r).spec.source.names == ("prose", "code")


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
    assert len(z.Pipeline.from_config(r).spec.source) == 5


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
    p = z.Pipeline.from_config(r)
    assert p.spec.record_ops[0].spec()["tokenizer"]["kind"] == "huggingface"
    pv = p.preview(n=3)
    assert "huggingface" in pv.decoder
    assert any("prose line" in d.text for row in pv.rows for d in row.documents)


def test_the_example_recipe_builds():
    p = z.Pipeline.from_config(EXAMPLE)
    assert p.spec.source.names == ("prose", "code")
    assert [d.num_samples for d in p.spec.source.datasets] == [50, 50]
    assert "pack" in str(p.explain())


def test_recipe_tables_match_the_python_signatures():
    """Each table's keys are parameters of its Python call, with the same defaults."""
    import inspect

    from zephon_dask.recipe import (
        BATCH,
        DATASETS,
        ENSURE_MIXTURE,
        PACK,
        REQUIRED_KEY,
        SHUFFLE,
        SOURCE,
        TOKENIZE,
    )

    methods = {"source": z.MixtureWorkSource.__init__, "tokenize": z.Pipeline.tokenize,
               "shuffle": z.Pipeline.shuffle, "ensure_mixture": z.Pipeline.ensure_mixture,
               "pack": z.Pipeline.pack, "batch": z.Pipeline.batch}
    for table, keys in TABLES.items():
        params = set(inspect.signature(methods[table]).parameters)
        assert set(keys) <= params, table
    for table, method in [(SOURCE, z.MixtureWorkSource.__init__), (TOKENIZE, z.Pipeline.tokenize),
                          (SHUFFLE, z.Pipeline.shuffle), (ENSURE_MIXTURE, z.Pipeline.ensure_mixture),
                          (PACK, z.Pipeline.pack), (BATCH, z.Pipeline.batch),
                          (DATASETS, z.Dataset.from_jsonl)]:
        params = inspect.signature(method).parameters
        for key in table.keys:
            if key.name in ("format", "weight"):  # chosen by the recipe, not by a keyword of the call
                continue
            default = params[key.name].default
            expected = REQUIRED_KEY if default is inspect.Parameter.empty else default
            assert key.default == expected, (table.header, key.name)


def test_the_docs_recipe_reference_is_the_definition():
    from zephon_dask.recipe import reference_markdown

    text = (Path(__file__).resolve().parents[2] / "docs" / "recipes.md").read_text()
    assert reference_markdown() in text, "the recipe reference is stale: run `make docs`"


def test_the_reference_names_every_table_and_key_the_loader_accepts():
    from zephon_dask.options import OPTIONS
    from zephon_dask.recipe import ALL_TABLES, SCHEDULE_KEYS, TOP_LEVEL, reference_markdown

    text = reference_markdown()
    assert [t.header for t in ALL_TABLES] == ["[[datasets]]", "[source]", "[tokenize]", "[shuffle]",
                                              "[ensure_mixture]", "[pack]",
                                              "[batch]", "[options]", "[[mixture.schedule]]"]
    assert {t.header.strip("[]").split(".")[0] for t in ALL_TABLES} == set(TOP_LEVEL)
    for table in ALL_TABLES:
        assert f"### `{table.header}`" in text
        for key in table.keys:
            assert f"| `{key.name}` |" in text
    assert SCHEDULE_KEYS == ("step", "chunk", "weights")
    assert {o.name for o in OPTIONS if o.toml} == {k.name for k in ALL_TABLES[7].keys}


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
    (("prefetch_windows = 1", "prefetch_window = 1"), RecipeKeyError, ValueError, ["[options]", "'prefetch_window'", "did you mean 'prefetch_windows'"]),
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


BUILD_ERRORS = [
    # (edit of BASE, error type, what the message says, in recipe terms)
    (('algorithm = "first_fit"', 'algorithm = "tetris"'), ConfigError, ": [pack]: algorithm = 'tetris' is unknown"),
    (("buffer_size = 5", "buffer_size = 0"), ConfigError, ": [shuffle]: buffer_size = 0 must be a positive"),
    (("chunk_size = 6", "chunk_size = 0"), ConfigError, ": [source] with the [[datasets]] weights: chunk_size = 0 must"),
    (("prefetch_windows = 1", "global_batches_per_step = 3"), ConfigError,
     ": [options]: global_batches_per_step = 3 must be a positive multiple of canonical_replicas = 2"),
]


@pytest.mark.parametrize(("edit", "error", "fragment"), BUILD_ERRORS)
def test_bad_values_fail_at_build_naming_the_recipe_table_and_key(corpus, edit, error, fragment):
    r = load_recipe(recipe(corpus, BASE.replace(*edit, 1)))
    with pytest.raises(error) as info:
        z.Pipeline.from_config(r)
    message = str(info.value)
    assert message.startswith(str(r.path)) and fragment in message
    assert "(" not in message.split(":", 3)[-1].split(" ")[1], "no Python call syntax: " + message


def test_a_missing_text_field_names_the_dataset_table_and_key(corpus):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": ["one", "two"]}), corpus / "data" / "notes.parquet")
    text = BASE.replace('name = "prose"\npath = "data/prose.jsonl"', 'name = "prose"\npath = "data/notes.parquet"')
    r = load_recipe(recipe(corpus, text))
    with pytest.raises(z.errors.MissingFieldError) as info:
        z.Pipeline.from_config(r)
    message = str(info.value)
    assert message.startswith(f"{r.path}: [[datasets]] 'prose': ") and "['body']" in message
    assert "Set text_field = " in message
    assert "Pass" not in message and "text_field=" not in message and "Dataset.from" not in message


def test_in_recipe_terms_rewords_python_calls():
    from zephon_dask.recipe import BATCH, DATASETS, in_recipe_terms

    jsonl = ("dataset 'prose': data/prose.jsonl: line 1 has no field 'body'; fields present: ['text']. "
             "Pass text_field=<one of them> to Dataset.from_jsonl")
    assert in_recipe_terms(jsonl, DATASETS, "prose") == (
        "data/prose.jsonl: line 1 has no field 'body'; fields present: ['text']. "
        "Set text_field = <one of them> in this [[datasets]] table")
    assert in_recipe_terms("batch(drop_last=1) must be True or False", BATCH) == "drop_last = 1 must be True or False"
    assert in_recipe_terms("labels=True needs tokens", BATCH) == "labels = true needs tokens"
    untouched = "every dataset's first pass; pass the schedule it resolves"
    assert in_recipe_terms(untouched, BATCH) == untouched


def test_keep_pack_options_and_dataset_ids_from_a_recipe_match_the_hand_built_pipeline(tmp_path):
    for name, domain in (("prose", 0), ("code", 1)):
        write_jsonl(tmp_path / "data" / f"{name}.jsonl",
                    [{"text": f"{name} {i} " * (i % 4 + 1), "domain": domain + i % 2} for i in range(30)])
    path = recipe(tmp_path, """
        [[datasets]]
        name = "prose"
        path = "data/prose.jsonl"
        [[datasets]]
        name = "code"
        path = "data/code.jsonl"
        [source]
        chunk_size = 6
        [tokenize]
        keep = ["domain"]
        [pack]
        max_length = 32
        algorithm = "best_fit"
        max_sequences_per_bin = 2
        min_sequence_length = 3
        drop_oversized = true
        groups = "domain"
        shuffle_bins = true
        [batch]
        microbatch_size = 2
        dataset_ids = true
        [options]
        runner = "synchronous"
        canonical_replicas = 2
        """)
    p = z.Pipeline.from_config(path)
    source = z.MixtureWorkSource([z.Dataset.from_jsonl(n, tmp_path / "data" / f"{n}.jsonl") for n in ("prose", "code")],
                                 chunk_size=6)
    q = (z.Pipeline(source).tokenize(keep=["domain"])
         .pack(32, "best_fit", max_sequences_per_bin=2, min_sequence_length=3, drop_oversized=True, groups="domain",
               shuffle_bins=True).batch(2, dataset_ids=True).options(runner="synchronous", canonical_replicas=2))
    assert p.fingerprint() == q.fingerprint() and p.description.batch == q.description.batch
    with p:
        batch = next(iter(p))
    assert batch["domain"].shape == batch["dataset_ids"].shape == batch["tokens"].shape


def test_per_dataset_repetition_and_read_order_in_a_recipe(corpus):
    text = BASE.replace("shuffle_shards = false", 'shuffle_shards = false\n'
                        'exhausted_policy = { prose = "stop", code = "repeat" }\nmax_repeats = { code = 1 }\n'
                        'reshuffle_on_repeat = { code = false }\nread_order = "weighted_random"\n'
                        'within_dataset = "shuffle"')
    p = z.Pipeline.from_config(recipe(corpus, text))
    prose = z.Dataset.from_jsonl("prose", corpus / "data" / "prose.jsonl")
    code = z.Dataset.from_jsonl("code", corpus / "data" / "code", text_field="text")
    source = z.MixtureWorkSource([prose, code], {"prose": 2, "code": 1}, chunk_size=6, seed=7, shuffle_shards=False,
                                 exhausted_policy={"prose": "stop", "code": "repeat"}, max_repeats={"code": 1},
                                 reshuffle_on_repeat={"code": False}, read_order="weighted_random",
                                 within_dataset="shuffle")
    q = (z.Pipeline(source).tokenize("bytes", bos=True).shuffle(5).ensure_mixture(strict=True, buffer_size=7).pack(48, algorithm="first_fit", num_bins=4)
         .batch(2, labels=True).options(canonical_replicas=2, flush_every_k_chunks=3, runner="synchronous",
                                        prefetch_windows=1))
    assert p.fingerprint() == q.fingerprint()
    assert len(p.spec.source) == 7  # prose's 30 samples, 4 a chunk
    text = str(p.explain())
    assert "per dataset" in text and "1 + 1 pass(es)" in text and "weighted_random" in text
