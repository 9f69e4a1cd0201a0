"""Mistakes caught when a dataset or a pipeline is built, not when it is iterated: record fields,
operator order and argument types (with "did you mean"), and hints for habits from other
libraries (hub names, ``"byte"``, ``device="cuda"`` on a torch without CUDA)."""

from __future__ import annotations

import gzip
import json

import fsspec
import pytest

import zephon_dask as z
from zephon_dask.errors import (
    ConfigError,
    DatasetNotFoundError,
    DeviceUnavailableError,
    MissingFieldError,
    RecipePathError,
)


def jsonl(records) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


@pytest.fixture
def memory_jsonl():
    """A folder of JSONL files on fsspec's memory file system (plain and gzip); removed after."""
    fs = fsspec.filesystem("memory")
    rows = [{"body": f"doc {i}", "id": i} for i in range(5)]
    fs.pipe("/build_checks/plain/a.jsonl", b"\n" + jsonl(rows) + b"{not json\n")  # only line 2 is read
    fs.pipe("/build_checks/gz/a.jsonl.gz", gzip.compress(jsonl(rows)))
    yield "memory://build_checks"
    fs.rm("/build_checks", recursive=True)


def one_source(ds):
    return z.Pipeline(z.MixtureWorkSource([ds], chunk_size=4, seed=0)).options(canonical_replicas=1)


def records():
    return z.Dataset.from_records("docs", [{"text": f"doc {i}", "lang": "en"} for i in range(8)])


# -- a dataset's fields are known at construction ------------------------------------------------------


@pytest.mark.parametrize("folder", ["plain", "gz"])
def test_wrong_text_field_fails_at_construction_with_the_fields_present(memory_jsonl, folder):
    path = f"{memory_jsonl}/{folder}/"
    with pytest.raises(MissingFieldError) as info:
        z.Dataset.from_jsonl("web", path, text_field="bdy", progress=False)
    message = str(info.value)
    for part in ("'web'", "first record", "'bdy'", "did you mean 'body'?", "['body', 'id']", "text_field="):
        assert part in message, (part, message)
    with pytest.raises(MissingFieldError, match=r"no field 'text'; fields present: \['body', 'id'\]"):
        z.Dataset.from_jsonl("web", path, progress=False)  # the default text_field
    ds = z.Dataset.from_jsonl("web", path, text_field="body", progress=False)
    assert ds.fields == ("body", "id") and ds.num_samples >= 5  # a bad later line is not read here


def test_wrong_column_of_parquet_and_records_say_did_you_mean(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"content": ["a", "b"], "url": ["u", "v"]}), tmp_path / "a.parquet")
    with pytest.raises(MissingFieldError, match=r"no field 'contents'; did you mean 'content'\? "
                                                r"fields present: \['content', 'url'\]"):
        z.Dataset.from_parquet("wiki", tmp_path, text_field="contents")  # checked against the schema
    assert z.Dataset.from_parquet("wiki", tmp_path, text_field="content").fields == ("content", "url")
    with pytest.raises(MissingFieldError, match=r"no field 'text'; did you mean 'Text'\?.*from_records"):
        z.Dataset.from_records("toy", [{"Text": "a"}])


def test_tokenize_field_is_checked_when_the_pipeline_is_built():
    base = one_source(records())
    with pytest.raises(MissingFieldError) as info:
        base.tokenize(field="txt")
    for part in ("'docs'", "'txt'", "did you mean 'text'?", "['lang', 'text']", "tokenize(field="):
        assert part in str(info.value), part
    base.map(lambda r: {**r, "txt": r["text"]}, version=1).tokenize(field="txt")  # a map may add it


# -- operators' inputs and argument types ---------------------------------------------------------------


def test_batch_needs_tokens_and_is_set_once(tmp_path):
    base = one_source(records())
    with pytest.raises(ConfigError, match=r"\.batch\(\) needs token ids: call \.tokenize\(\.\.\.\) first"):
        base.batch(2)
    with pytest.raises(ConfigError, match=r"\.batch\(4\) follows \.batch\(2\).*call \.batch\(\) once"):
        base.tokenize().batch(2).batch(4)
    assert base.tokenize().pack(8).batch(2).description.batch.microbatch_size == 2
    (tmp_path / "d.jsonl").write_text(jsonl([{"text": "hello"}] * 4).decode())
    (tmp_path / "r.toml").write_text('[[datasets]]\nname = "d"\npath = "d.jsonl"\n[tokenize]\n'
                                     '[batch]\nmicrobatch_size = 2\n')
    recipe = z.Pipeline.from_config(tmp_path / "r.toml")  # a recipe's [batch] is a default
    assert recipe.batch(1, labels="hf").description.batch.labels == "hf"
    with pytest.raises(ConfigError, match="follows"):
        recipe.batch(1).batch(3)


@pytest.mark.parametrize(("build", "parts"), [
    (lambda p: p.tokenize("bytes", eos="yes"), ["tokenize(eos='yes')", "True or False", "not a str"]),
    (lambda p: p.tokenize("bytes", bos=1), ["tokenize(bos=1)", "True or False"]),
    (lambda p: p.tokenize("bytes", max_length=8, split_long="no"), ["split_long='no'", "True or False"]),
    (lambda p: p.tokenize("bytes", field=""), ["tokenize(field='')", "non-empty str"]),
    (lambda p: p.tokenize().batch(2, drop_last="no"), ["batch(drop_last='no')", "True or False"]),
    (lambda p: p.tokenize().batch(2, cu_seqlens=1), ["batch(cu_seqlens=1)", "True or False"]),
    (lambda p: p.tokenize().batch(2, ignore_index=True), ["batch(ignore_index=True)", "an int"]),
    (lambda p: p.tokenize().batch(2, labels="HF"), ["labels='HF'", "did you mean 'hf'?"]),
    (lambda p: p.tokenize().pack(8, algorithm="bestfit"), ["algorithm='bestfit'", "did you mean 'best_fit'?"]),
    (lambda p: p.decode_text(errors="replac"), ["errors='replac'", "did you mean 'replace'?", "'strict'"]),
    (lambda p: p.decode_text(encoding=8), ["encoding=8", "codec name"]),
    (lambda p: p.tokenize("bytes", bos_id=3), ["tokenize(bos_id=3)", "bos=False", "pass bos=True"]),
    (lambda p: p.map(lambda r: r, version=1.5), ["map(version=1.5)", "a str, an int or None"]),
    (lambda p: p.filter(lambda r: True, name=3), ["filter(name=3)", "non-empty str or None"]),
    (lambda p: p.tokenize("byte"), ["tokenizer='byte'", "did you mean 'bytes'?"]),
    (lambda p: p.tokenize("Bytes"), ["did you mean 'bytes'?"]),
])
def test_bad_arguments_are_refused_at_build_time(build, parts):
    with pytest.raises(ConfigError) as info:
        build(one_source(records()))
    for part in parts:
        assert part in str(info.value), (part, str(info.value))


# -- habits from other libraries -------------------------------------------------------------------------


@pytest.mark.parametrize(("build", "name", "download"), [
    (lambda p: p.tokenize("gpt2"), "'gpt2'", "snapshot_download('gpt2', allow_patterns=['tokenizer*'])"),
    (lambda p: p.tokenize("meta-llama/Llama-3.2-1B"), "'meta-llama/Llama-3.2-1B'", "tokenizer.json"),
    (lambda p: p.tokenize_chat("Qwen/Qwen2-0.5B-Instruct"), "'Qwen/Qwen2-0.5B-Instruct'", "tokenize_chat(folder)"),
    (lambda p: z.Dataset.from_hf("fw", "HuggingFaceFW/fineweb"), "'HuggingFaceFW/fineweb'",
     "snapshot_download('HuggingFaceFW/fineweb', repo_type='dataset')"),
    (lambda p: z.Dataset.from_path("fw", "HuggingFaceFW/fineweb-edu"), "'HuggingFaceFW/fineweb-edu'",
     "Dataset.from_hf('name', folder"),
])
def test_hub_names_say_nothing_is_downloaded_and_how_to_download(build, name, download):
    with pytest.raises(DatasetNotFoundError) as info:
        build(one_source(records()))
    message = str(info.value)
    for part in (name, "never downloads", "from huggingface_hub import snapshot_download", download):
        assert part in message, (part, message)


def test_recipes_get_the_same_checks_and_hints_naming_the_key(tmp_path):
    (tmp_path / "d.jsonl").write_text('{"body": "x"}\n')
    recipe = tmp_path / "r.toml"
    recipe.write_text('[[datasets]]\nname = "d"\npath = "d.jsonl"\ntext_field = "bdy"\n')
    with pytest.raises(MissingFieldError, match=r"did you mean .body.\?.*Set text_field = <one of them>$") as info:
        z.Pipeline.from_config(recipe)
    assert f"{recipe}: [[datasets]] 'd': " in str(info.value)  # where in the recipe, first
    for tokenizer, part in (("gpt2", "snapshot_download('gpt2'"), ("byte", "did you mean 'bytes'?")):
        recipe.write_text(f'[[datasets]]\nname = "d"\npath = "d.jsonl"\ntext_field = "body"\n'
                          f'[tokenize]\ntokenizer = "{tokenizer}"\n')
        with pytest.raises(RecipePathError) as info:
            z.Pipeline.from_config(recipe)
        assert f"[tokenize] tokenizer = '{tokenizer}'" in str(info.value) and part in str(info.value)


def test_a_missing_tokenizer_file_is_not_taken_for_a_hub_name(tmp_path):
    with pytest.raises(DatasetNotFoundError, match="does not exist; pass the path of a Hugging Face") as info:
        one_source(records()).tokenize(str(tmp_path / "tok" / "tokenizer.json"))
    assert "snapshot_download" not in str(info.value)


def test_cuda_device_without_cuda_is_a_typed_error_and_works_with_cuda():
    import torch

    pipe = one_source(records()).tokenize().pack(8).batch(2).options(runner="synchronous")
    if not torch.cuda.is_available():
        with pytest.raises(DeviceUnavailableError, match=r"to_torch\(device='cuda'\): CUDA is not available.*"
                                                         r"device='cpu'"):
            pipe.to_torch(device="cuda")  # when called, not at the first batch
        with pytest.raises(DeviceUnavailableError, match="CUDA is not available"):
            next(iter(pipe)).to_torch(device="cuda")
        pipe.close()
        return
    with pipe:  # the CUDA path still works where CUDA exists
        batch = next(iter(pipe.to_torch(device="cuda")))
        assert batch["tokens"].device.type == "cuda"
    with pytest.raises(DeviceUnavailableError, match="GPU"):
        pipe.to_torch(device=f"cuda:{torch.cuda.device_count()}")
