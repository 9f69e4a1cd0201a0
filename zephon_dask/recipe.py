"""TOML recipes: a pipeline described in a file (reference: ``docs/recipes.md``).

:func:`load_recipe` reads a recipe and checks its tables, keys, TOML types and
that the local paths it names exist, then returns an immutable
:class:`Recipe`; it opens no dataset. ``Pipeline.from_config(recipe)`` builds
the datasets (indexing their files, :meth:`Recipe.work_source`) and the
pipeline (:meth:`Recipe.apply`). This module lies below the pipeline package:
it never imports it, and applies its tables to the pipeline it is given.
Values are checked by the same constructors as in Python, so a recipe and the
equivalent hand-built pipeline have the same fingerprint; their errors are
reworded in recipe terms (:func:`in_recipe_terms`: the table, the dataset and
``key = value``).

Every table and key (TOML types, default, doc) is defined once here
(:data:`ALL_TABLES`): the loader checks with it and the reference in
``docs/recipes.md`` is :func:`reference_markdown` (a test compares them). Pure
data; nothing here holds state.

Relative paths (datasets, a ``tokenizer.json``) are relative to the recipe's
folder; URLs (anything with ``://``) are used as written.
"""

from __future__ import annotations

import glob
import os
import re
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from .curriculum import MixtureWorkSource
from .curriculum.read_order import READ_ORDERS, WITHIN_DATASET
from .curriculum.routing import LANE_ASSIGNMENTS
from .curriculum.schedule import parse as parse_schedule
from .curriculum.token_weights import WEIGHT_BY
from .data import Dataset, hf
from .data.formats import READERS
from .data.formats import get as format_reader
from .data.paths import has_glob
from .errors import (
    ConfigError,
    RecipeError,
    RecipeKeyError,
    RecipePathError,
    RecipeTypeError,
    ZephonError,
)
from .operators.pack import ALGORITHMS as PACK_ALGORITHMS
from .operators.shuffle import ALGORITHMS as SHUFFLE_ALGORITHMS
from .options import BY_NAME as OPTIONS
from .validate import did_you_mean


def dataset_formats() -> tuple[str, ...]:
    """The formats a recipe may name: every registered format but in-memory records."""
    return tuple(f for f in READERS if f != "records")


_INT, _BOOL, _STR = (int,), (bool,), (str,)
_NUMBER = (int, float)
_TABLE = (dict,)

SECRET_KEYS = ("storage_options",)  # values never echoed in a message: they may hold credentials

class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED_KEY: Any = _Required()  # the default of a key a table must set


@dataclass(frozen=True)
class Key:
    """One recipe key: the TOML types it accepts, its default (:data:`REQUIRED_KEY`: must be
    set; ``None``: leave it out for the Python default ``None``), a one-line doc, its choices,
    and how the reference writes a default that no TOML value expresses."""

    name: str
    types: tuple[type, ...]
    default: Any
    doc: str
    choices: tuple[str, ...] = ()
    default_doc: str = ""


@dataclass(frozen=True)
class Table:
    """One recipe table: its header as written in TOML, a one-line doc, the Python it becomes
    (for the reference) and its keys."""

    header: str
    doc: str
    python: str
    keys: tuple[Key, ...]

    @property
    def types(self) -> dict[str, tuple[type, ...]]:
        """``{key: accepted TOML types}``."""
        return {k.name: k.types for k in self.keys}

    @property
    def required(self) -> tuple[str, ...]:
        """The keys the table must set."""
        return tuple(k.name for k in self.keys if k.default is REQUIRED_KEY)


# Every recipe table and key, defined once: the loader checks with these, the reference in
# docs/recipes.md is reference_markdown() (a test compares them), and a test compares each default
# with the Python call's.
DATASETS = Table("[[datasets]]", "one table per dataset, at least one",
                 "`Dataset.from_path(name, path, text_field=...)`, or `Dataset.from_<format>(...)` "
                 "when `format` is set", (
    Key("name", _STR, REQUIRED_KEY,
        "the dataset's name, unique in the recipe: it keys the weights, the schedule, stats and lineage"),
    Key("path", _STR, REQUIRED_KEY,
        "a file, folder, glob or URL; a relative path starts at the recipe's folder"),
    Key("format", _STR, None, "the file format", dataset_formats(), "detected from the path"),
    Key("text_field", _STR, "text", "the field (column) that holds the text; not for a token store"),
    Key("weight", _NUMBER, None,
        "the dataset's share of samples (of tokens with `[source]` `weight_by = \"tokens\"`), "
        "relative to the others; set in every `[[datasets]]` table or in none, and not with "
        "`[[mixture.schedule]]`", (), "shares proportional to the sample counts"),
    Key("storage_options", _TABLE, None, "options of the path's filesystem (fsspec), e.g. `{ endpoint_url "
        "= \"...\" }` for an S3 server; keys and secrets are better left to the environment (see "
        "[object storage](object-storage.md)); never shown in a message, repr or state",
        (), "none"),
))
SOURCE = Table("[source]", "how the datasets are ordered, mixed and cut into chunks",
               "`MixtureWorkSource(datasets, weights, **source)`", (
    Key("chunk_size", _INT, None, "samples per chunk, the unit a lane receives; each dataset fills its "
        "weight's share of every chunk", (), "chosen from the data: 1024, or the largest power of two "
        "that gives every lane a chunk"),
    Key("seed", _INT, 0, "the seed of the sample orders and of the chunk-to-lane routing (and of "
        "`[shuffle]` unless it sets one)"),
    Key("shuffle_shards", _BOOL, True, "shuffle the order of each dataset's shards"),
    Key("shuffle_within_shard", _BOOL, True, "shuffle the samples inside each shard"),
    Key("shuffle_block_size", _INT, None, "also permute positions inside consecutive blocks of this "
        "many samples (mixes shards locally, reads stay close together)", (), "no block shuffle"),
    Key("stop_after_passes", _INT, 1, "end the stream after the first chunk at which every dataset "
        "has completed this many passes"),
    Key("exhausted_policy", (str, dict), None, "instead of `stop_after_passes`: `\"stop\"` ends before the "
        "first chunk that needs a sample past any dataset's first pass, `\"repeat\"` repeats the "
        "datasets; or an inline table naming every dataset, e.g. `{ web = \"stop\", curated = \"repeat\" }`",
        ("stop", "repeat"), "`stop_after_passes` decides"),
    Key("max_repeats", (int, dict), None, "with `exhausted_policy = \"repeat\"`: passes after the first "
        "before the stream ends; or an inline table for some repeating datasets, e.g. `{ curated = 3 }`",
        (), "the stream never ends"),
    Key("reshuffle_on_repeat", (bool, dict), True, "each pass gets a fresh order (`false`: every pass "
        "repeats the first one's); or an inline table for some datasets, e.g. `{ curated = false }`"),
    Key("read_order", _STR, "weighted_round_robin", "the order of the datasets' records inside a chunk: "
        "evenly interleaved, or a seeded random arrangement of the same records", READ_ORDERS),
    Key("within_dataset", _STR, "as_is", "each dataset's records inside a chunk in their own order, or "
        "shuffled (seeded by the chunk)", WITHIN_DATASET),
    Key("lane_assignment", _STR, "permute", "which lane gets which chunk of a block: shuffled by "
        "seed and block (`permute`), or chunk `g` to lane `g % R` (`modulo`)", LANE_ASSIGNMENTS),
    Key("weight_by", _STR, "samples", "read the weights as shares of samples or of tokens (the "
        "tokens per sample are measured once with `[tokenize]`)", WEIGHT_BY),
    Key("tokens_per_sample", (int, float, dict), None, "with `weight_by = \"tokens\"`: one number for every "
        "dataset, or an inline table pinning some, e.g. `{ code = 900 }` (the others are measured)",
        (), "measured"),
))
TOKENIZE = Table("[tokenize]", "how text becomes token ids", "`pipeline.tokenize(**tokenize)`", (
    Key("tokenizer", _STR, "bytes", "`\"bytes\"` (UTF-8 bytes, BOS 256, EOS 257; needs no file) or "
        "the path of a Hugging Face `tokenizer.json`, relative to the recipe's folder"),
    Key("field", _STR, None, "the record field to encode", (), "each dataset's `text_field`"),
    Key("bos", _BOOL, False, "add the BOS id before each document"),
    Key("eos", _BOOL, True, "add the EOS id after each document"),
    Key("max_length", _INT, None, "cap a document's tokens (BOS/EOS included); the rest is dropped "
        "and counted, unless `split_long`", (), "no cap"),
    Key("split_long", _BOOL, False, "cut long documents into `max_length` pieces instead"),
    Key("bos_id", (int, str), None, "the BOS id: an integer, or a token string of a Hugging Face "
        "tokenizer", (), "the tokenizer's, found by name"),
    Key("eos_id", (int, str), None, "the EOS id, like `bos_id`", (), "the tokenizer's, found by name"),
    Key("keep", (list, dict), None, "numeric record fields carried into each batch, one value per token "
        "(its document's): a list of names, or a table `{ name = \"int64\" }` (`int64`, `float32`, "
        "`float64` or `bool`)", (), "none"),
))
SHUFFLE = Table("[shuffle]", "a shuffle inside each window (runs before `[pack]`)",
                "`pipeline.shuffle(**shuffle)`", (
    Key("buffer_size", _INT, REQUIRED_KEY, "samples held in the buffer (larger mixes more)"),
    Key("seed", _INT, None, "this shuffle's seed", (), "`[source]` `seed`"),
    Key("algorithm", _STR, "reservoir", "`reservoir` evicts the slot each new sample's identity names; "
        "`block` permutes consecutive blocks of `buffer_size`; `block_warmup` grows the blocks from "
        "`buffer_size / 16` so a window's first samples come early", SHUFFLE_ALGORITHMS),
))
ENSURE_MIXTURE = Table("[ensure_mixture]", "re-balance each window toward the target mixture after the "
                       "filters and splits (runs after `[shuffle]`, before `[pack]`)",
                       "`pipeline.ensure_mixture(**ensure_mixture)`", (
    Key("weights", _TABLE, None, "an inline table `{ name = share, ... }` of the target (a dataset left out "
        "gets 0)", (), "the source's mixture: what the curriculum drew into each window"),
    Key("weight_by", _STR, "samples", "the target's unit: shares of samples or of real tokens",
        WEIGHT_BY),
    Key("strict", _BOOL, False, "drop the surplus of over-represented datasets so each window delivers "
        "the target (`false`: keep every sample, only reorder toward it)"),
    Key("buffer_size", _INT, 1024, "samples held while reordering (the lookahead)"),
    Key("warn_tolerance", _NUMBER, None, "warn once per iteration when a window's delivered share "
        "drifts further than this from the target", (), "never warns"),
))
PACK = Table("[pack]", "documents packed into rows of exactly `max_length` tokens, inside each window",
             "`pipeline.pack(**pack)`", (
    Key("max_length", _INT, REQUIRED_KEY, "tokens per row"),
    Key("algorithm", _STR, "wrap", "`wrap` concatenates and cuts; `first_fit` and `best_fit` place "
        "whole documents in open bins, padded; `best_fit_wrap` fills rows with no padding, cutting at "
        "most one document per row (see [operators](operators.md))", PACK_ALGORITHMS),
    Key("pad_id", _INT, 0, "the padding id (bin packing, and batches)"),
    Key("num_bins", _INT, None, "open bins of `first_fit` / `best_fit`", (), "64"),
    Key("drop_oversized", _BOOL, False, "`first_fit` / `best_fit`: drop documents longer than "
        "`max_length` instead of cutting them"),
    Key("max_sequences_per_bin", _INT, None, "`first_fit` / `best_fit`: at most this many documents in a "
        "row", (), "no cap"),
    Key("min_sequence_length", _INT, None, "drop documents shorter than this many tokens", (), "none dropped"),
    Key("groups", _STR, None, "a field kept by `[tokenize]` `keep`: only documents with the same value "
        "share a row", (), "no groups"),
    Key("shuffle_bins", _BOOL, False, "emit each window's rows in a seeded order instead of packing order"),
))
BATCH = Table("[batch]", "the batch shape (cut per lane; a batch never mixes lanes)",
              "`pipeline.batch(**batch)`", (
    Key("microbatch_size", _INT, REQUIRED_KEY, "samples (rows) per batch"),
    Key("drop_last", _BOOL, True, "drop a lane's last partial batch"),
    Key("labels", (bool, str), False, "also build `input_ids`, `labels` and `loss_mask`: `true` or "
        "`\"shifted\"` for next-token targets, `\"hf\"` for unshifted labels with `attention_mask` and "
        "`position_ids` (models that shift themselves)"),
    Key("ignore_index", _INT, -100, "the label of positions that are not trained on"),
    Key("mask_document_boundaries", _BOOL, False, "no label across a document boundary"),
    Key("cu_seqlens", _BOOL, False, "also build `cu_seqlens` for variable-length attention"),
    Key("dataset_ids", _BOOL, False, "also build `dataset_ids`: each token's dataset index, in the "
        "order of `[[datasets]]` (-1 on padding)"),
))
SCHEDULE = Table("[[mixture.schedule]]", "optional, one table per phase in order: weights that change "
                 "during the run (see [Mixture schedules](#mixture-schedules))",
                 "`MixtureWorkSource(..., schedule=[(step, weights), ...], schedule_unit=\"step\")` "
                 "(or `\"chunk\"`)", (
    Key("step", _INT, None, "the global training step at which the phase starts (the first phase: "
        "0)", (), "required: `step` or `chunk`"),
    Key("chunk", _INT, None, "instead of `step`: the global chunk index at which the phase starts, a "
        "multiple of `canonical_replicas`", (), "required: `step` or `chunk`"),
    Key("weights", _TABLE, REQUIRED_KEY, "an inline table `{ name = weight, ... }` of the phase's "
        "weights; a dataset left out has weight 0 in the phase"),
))
# The tables whose keys are passed unchanged to one Python call, in the order the pipeline applies them.
CALL_TABLES = (SOURCE, TOKENIZE, SHUFFLE, ENSURE_MIXTURE, PACK, BATCH)
OPTIONS_TABLE = Table("[options]", "data settings (in the fingerprint), step settings (kept on resume), "
                      "then execution settings (never change a byte); every option but `client` (see "
                      "[execution](execution.md#options))", "`pipeline.options(**options)`", tuple(
    Key(o.name, o.toml, o.default, f"*{o.kind}*: {o.doc}", o.choices) for o in OPTIONS.values() if o.toml))

TABLES: dict[str, dict[str, tuple[type, ...]]] = {t.header.strip("[]"): t.types for t in CALL_TABLES}
REQUIRED = {t.header.strip("[]"): t.required for t in CALL_TABLES if t.required}
DATASET_KEYS, DATASET_REQUIRED = DATASETS.types, DATASETS.required
OPTION_TYPES = OPTIONS_TABLE.types
SCHEDULE_KEYS = tuple(SCHEDULE.types)  # one [[mixture.schedule]] table: a start and the weights
TOP_LEVEL = ("datasets", "mixture", *TABLES, "options")

_TYPE_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string",
               dict: "an inline table"}
_EXAMPLES = {int: "8", float: "0.5", bool: "true", str: '"..."', dict: '{ key = "..." }'}


# -- the reference ------------------------------------------------------------------------

_TOML_TYPE_NAMES = {int: "integer", float: "number", bool: "bool", str: "string", dict: "inline table",
                    list: "array"}
ALL_TABLES = (DATASETS, SOURCE, TOKENIZE, SHUFFLE, ENSURE_MIXTURE, PACK, BATCH, OPTIONS_TABLE, SCHEDULE)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return f'"{value}"' if isinstance(value, str) else repr(value)


def _default(key: Key) -> str:
    if key.default is REQUIRED_KEY:
        return "required"
    if key.default_doc:
        return key.default_doc
    return "none" if key.default is None else f"`{_toml_value(key.default)}`"


def reference_markdown() -> str:
    """Every recipe table and key as the Markdown reference of ``docs/recipes.md``."""
    parts = []
    for table in ALL_TABLES:
        rows = ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
        for k in table.keys:
            types = "number" if k.types == _NUMBER else " or ".join(_TOML_TYPE_NAMES[t] for t in k.types)
            choices = f" (one of {', '.join(_toml_value(c) for c in k.choices)})" if k.choices else ""
            rows.append(f"| `{k.name}` | {types} | {_default(k)} | {k.doc}{choices} |")
        parts.append(f"### `{table.header}`\n\n{table.doc[0].upper()}{table.doc[1:]}. In Python: "
                     f"{table.python}.\n\n"
                     + "\n".join(rows))
    return "\n\n".join(parts)


@dataclass(frozen=True)
class DatasetEntry:
    """One ``[[datasets]]`` table; ``path`` is resolved against the recipe's folder."""

    name: str
    path: str
    format: str | None = None
    text_field: str | None = None
    weight: int | float | None = None
    storage_options: dict[str, Any] | None = field(default=None, repr=False)  # may hold credentials

    def open(self):
        """The :class:`~zephon_dask.data.Dataset` (does the I/O of indexing its files)."""
        kwargs: dict[str, Any] = {} if self.text_field is None else {"text_field": self.text_field}
        if self.storage_options is not None:
            kwargs["storage_options"] = self.storage_options
        if self.format is None:
            return Dataset.from_path(self.name, self.path, **kwargs)
        constructor = format_reader(self.format).constructor
        if constructor is None:
            return Dataset.from_files(self.name, self.path, self.format, **kwargs)
        ctor = getattr(Dataset, constructor)
        return ctor(self.name, self.path, **kwargs)


@dataclass(frozen=True)
class Recipe:
    """A checked recipe (immutable; treat the dicts as read-only). Build it with :func:`load_recipe`."""

    path: str
    datasets: tuple[DatasetEntry, ...]
    source: dict[str, Any] = field(default_factory=dict)
    tokenize: dict[str, Any] | None = None
    shuffle: dict[str, Any] | None = None
    ensure_mixture: dict[str, Any] | None = None
    pack: dict[str, Any] | None = None
    batch: dict[str, Any] | None = None
    options: dict[str, Any] = field(default_factory=dict)
    schedule: tuple[tuple[int, dict[str, int | float]], ...] | None = None  # [[mixture.schedule]]
    schedule_unit: str = "step"

    @property
    def weights(self) -> dict[str, int | float] | None:
        """``{dataset: weight}``, or ``None`` (weights proportional to size) when no dataset sets one."""
        weights = {d.name: d.weight for d in self.datasets if d.weight is not None}
        return weights or None  # load_recipe checked: every dataset sets one, or none does

    def work_source(self) -> MixtureWorkSource:
        """Open the datasets and build the work source (``Pipeline.from_config`` starts here)."""
        datasets = []
        for entry in self.datasets:
            with _context(self.path, f"[[datasets]] {entry.name!r}", DATASETS, entry.name):
                datasets.append(entry.open())
        where = "[source]"
        if self.schedule is not None or self.weights is not None:
            where += " with the " + ("[[mixture.schedule]]" if self.schedule else "[[datasets]] weights")
        with _context(self.path, where, SOURCE):
            schedule = None if self.schedule is None else list(self.schedule)
            return MixtureWorkSource(datasets, self.weights, **self.source, schedule=schedule,
                                     schedule_unit=self.schedule_unit)

    def apply(self, pipeline):
        """``pipeline`` (over :meth:`work_source`) with the recipe's tables applied: tokenize, then
        shuffle, then ensure_mixture, then pack, then batch, then the options; an error names the table."""
        for table in (TOKENIZE, SHUFFLE, ENSURE_MIXTURE, PACK, BATCH):
            kwargs = getattr(self, table.header.strip("[]"))
            if kwargs is not None:
                with _context(self.path, table.header, table):
                    pipeline = getattr(pipeline, table.header.strip("[]"))(**kwargs)
        with _context(self.path, "[options]", OPTIONS_TABLE):
            return pipeline.options(**self.options)


@contextmanager
def _context(file: str, where: str, table: Table, dataset: str = "") -> Iterator[None]:
    """Errors raised inside say ``file: where: ...`` in recipe terms (:func:`in_recipe_terms`)."""
    try:
        yield
    except ZephonError as exc:
        message = in_recipe_terms(str(exc), table, dataset)
        try:
            translated = type(exc)(f"{file}: {where}: {message}")
        except Exception:  # an error class with other constructor arguments keeps its message
            exc.add_note(f"zephon_dask: in recipe {file}, {where}")
            raise exc from None
        for note in getattr(exc, "__notes__", ()):
            translated.add_note(note)
        raise translated.with_traceback(exc.__traceback__) from None
    except Exception as exc:
        exc.add_note(f"zephon_dask: in recipe {file}, {where}")
        raise


def in_recipe_terms(message: str, table: Table, dataset: str = "") -> str:
    """A Python API error message worded for ``table`` of a recipe: ``call(key=value)`` and
    ``key=value`` become ``key = value``, "Pass ... to Dataset.from_jsonl" becomes "Set ... in this
    [[datasets]] table", and a leading ``dataset 'name': `` (already in the location) goes."""
    keys = "|".join(re.escape(k.name) for k in table.keys)
    if dataset:
        message = message.removeprefix(f"dataset {dataset!r}: ")
    message = re.sub(rf"\b[A-Za-z_][\w.]*\(({keys})=([^()]*)\)", r"\1 = \2", message)
    message = re.sub(rf"(?<![\w.])({keys})=(?=[^\s=])", r"\1 = ", message)
    message = re.sub(rf"(?<![\w.])({keys}) = (True|False|None)\b",
                     lambda m: f"{m[1]} = {_PYTHON_TO_TOML[m[2]]}", message)
    message = re.sub(r" to (?:zephon_dask\.)?(?:Dataset|Pipeline|MixtureWorkSource)\b[\w.]*(?:\(\))?",
                     f" in this {table.header} table", message)
    message = re.sub(r" \(in a recipe: [^()]*\)", "", message)  # the recipe's own wording follows
    message = re.sub(rf"(^|[.;:]\s+)Pass (?=({keys}) = )", r"\1Set ", message)
    return re.sub(rf"\bpass (?=({keys}) = )", "set ", message)


_PYTHON_TO_TOML = {"True": "true", "False": "false", "None": "(left out)"}


def load_recipe(path: str | os.PathLike) -> Recipe:
    """Read and check the TOML recipe at ``path`` (no dataset is opened)."""
    file = os.path.abspath(os.fspath(path))
    try:
        with open(file, "rb") as fh:
            doc = tomllib.load(fh)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise RecipePathError(
            f"recipe {file!r} does not exist or is not a file; pass the path of a TOML recipe "
            "(examples/recipe.toml in the source tree is one)"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise RecipeError(f"{file}: not valid TOML ({exc}); fix the syntax at that line") from None
    base = os.path.dirname(file)
    _check_known(file, "the top level", doc, TOP_LEVEL, "table or key")
    tables: dict[str, dict[str, Any] | None] = {}
    for name, types in TABLES.items():
        table = _table(file, name, doc.get(name))
        if table is not None:
            _check_table(file, f"[{name}]", table, types, REQUIRED.get(name, ()))
        tables[name] = table
    if tables["tokenize"] is not None and tables["tokenize"].get("tokenizer", "bytes") != "bytes":
        tok = tables["tokenize"]["tokenizer"]
        tables["tokenize"]["tokenizer"] = _existing_path(file, base, "[tokenize]", "tokenizer", tok)
    datasets = _datasets(file, base, doc.get("datasets"))
    schedule, unit = _schedule(file, _table(file, "mixture", doc.get("mixture")), datasets)
    return Recipe(
        path=file,
        datasets=datasets,
        schedule=schedule,
        schedule_unit=unit,
        source=tables["source"] or {},
        tokenize=tables["tokenize"],
        shuffle=tables["shuffle"],
        ensure_mixture=tables["ensure_mixture"],
        pack=tables["pack"],
        batch=tables["batch"],
        options=_options(file, _table(file, "options", doc.get("options")) or {}),
    )


# -- checks ----------------------------------------------------------------------------


def _check_known(file: str, where: str, table: dict, known, what: str = "key") -> None:
    for key in sorted(table):
        if key not in known:
            raise RecipeKeyError(
                f"{file}: {where} has an unknown {what} {key!r}; {did_you_mean(key, known)}"
                f"known: {', '.join(known)}"
            )


def _check_type(file: str, where: str, key: str, value: Any, types: tuple[type, ...]) -> None:
    ok = isinstance(value, types) and (bool in types or not isinstance(value, bool))
    if not ok:
        expected = " or ".join(_TYPE_NAMES[t] for t in types)
        shown = f"(a {type(value).__name__})" if key in SECRET_KEYS else repr(value)
        raise RecipeTypeError(
            f"{file}: {where} {key} = {shown} must be {expected}; "
            f"write e.g. {key} = {_EXAMPLES[types[-1]]}"
        )


def _check_table(file: str, where: str, table: dict, types: dict, required=()) -> None:
    _check_known(file, where, table, types)
    for key in required:
        if key not in table:
            raise RecipeKeyError(
                f"{file}: {where} lacks the required key {key!r}; add e.g. {key} = "
                f"{_EXAMPLES[types[key][-1]]}"
            )
    for key in sorted(table):
        _check_type(file, where, key, table[key], types[key])


def _table(file: str, name: str, value: Any) -> dict | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise RecipeTypeError(
            f"{file}: {name} = {value!r} must be a table; write it as [{name}] followed by "
            "key = value lines"
        )
    return dict(value)


def _existing_path(file: str, base: str, where: str, key: str, value: str) -> str:
    """``value`` resolved against ``base``; local paths must exist (URLs are not checked)."""
    if "://" in value:
        return value
    resolved = os.path.normpath(os.path.join(base, os.path.expanduser(value)))
    found = glob.glob(resolved, recursive=True) if has_glob(resolved) else os.path.exists(resolved)
    if not found:
        hint = did_you_mean(value, ["bytes"]).strip() if key == "tokenizer" else ""
        if not hint and hf.looks_like_hub_id(value):
            hint = hf.download_hint(value, "tokenizer" if key == "tokenizer" else "dataset")
        raise RecipePathError(
            f"{file}: {where} {key} = {value!r} does not exist (looked for {resolved!r}); "
            "relative paths start at the recipe's folder: fix the path or create the data"
            + (f". {hint}" if hint else "")
        )
    return resolved


def _datasets(file: str, base: str, value: Any) -> tuple[DatasetEntry, ...]:
    if value is None or value == []:
        raise RecipeKeyError(
            f"{file}: the recipe has no [[datasets]]; add one table per dataset, e.g.\n"
            '[[datasets]]\nname = "web"\npath = "data/web/"'
        )
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise RecipeTypeError(
            f"{file}: datasets must be an array of tables: write each as [[datasets]] (two brackets)"
        )
    entries: list[DatasetEntry] = []
    for i, table in enumerate(value):
        where = f"[[datasets]] #{i + 1}"
        _check_table(file, where, table, DATASET_KEYS, DATASET_REQUIRED)
        fmt = table.get("format")
        if fmt is not None and fmt not in dataset_formats():
            raise RecipeError(
                f"{file}: {where} format = {fmt!r} is unknown; choose one of "
                f"{', '.join(map(repr, dataset_formats()))}, or leave it out to detect it from the path"
            )
        if fmt is not None and format_reader(fmt).holds_tokens and "text_field" in table:
            raise RecipeKeyError(
                f"{file}: {where} text_field = {table['text_field']!r} does not apply to a token "
                "store (its documents are token ids); remove it"
            )
        if any(e.name == table["name"] for e in entries):
            raise RecipeError(
                f"{file}: {where} name = {table['name']!r} is used by an earlier dataset; "
                "give each dataset a unique name"
            )
        path = _existing_path(file, base, where, "path", table["path"])
        entries.append(DatasetEntry(table["name"], path, fmt, table.get("text_field"), table.get("weight"),
                                    table.get("storage_options")))
    weighted = [e.weight is not None for e in entries]
    if any(weighted) and not all(weighted):
        missing = [e.name for e in entries if e.weight is None]
        raise RecipeKeyError(
            f"{file}: datasets {missing} have no weight while others do; set weight = ... in "
            "every [[datasets]] table, or in none (weights proportional to size)"
        )
    return tuple(entries)


def _schedule(file: str, table: dict | None, datasets: tuple[DatasetEntry, ...]):
    """``[[mixture.schedule]]`` as ``((start, weights), ...)`` and its unit, checked like the
    Python ``schedule=`` (sorted starts from 0, known datasets, weights >= 0), or ``(None, "step")``."""
    if table is None:
        return None, "step"
    _check_known(file, "[mixture]", table, ("schedule",))
    phases = table.get("schedule")
    if not isinstance(phases, list) or not phases or not all(isinstance(t, dict) for t in phases):
        raise RecipeTypeError(f"{file}: mixture.schedule must be an array of tables: write each phase as "
                              "[[mixture.schedule]] with step = ... and weights = { name = weight, ... }")
    if any(d.weight is not None for d in datasets):
        raise RecipeKeyError(f"{file}: [[datasets]] weights and [[mixture.schedule]] both set the mixture; "
                             "remove weight = ... from the datasets (the first phase holds the starting weights)")
    units = set()
    out = []
    for i, phase in enumerate(phases):
        where = f"[[mixture.schedule]] #{i + 1}"
        _check_known(file, where, phase, SCHEDULE_KEYS)
        starts = [k for k in ("step", "chunk") if k in phase]
        if len(starts) != 1 or "weights" not in phase:
            raise RecipeKeyError(f"{file}: {where} needs a start, step = ... (a global step) or chunk = ... "
                                 "(a chunk index), and weights = { name = weight, ... }")
        units.add(starts[0])
        _check_type(file, where, starts[0], phase[starts[0]], _INT)
        if not isinstance(phase["weights"], dict):
            raise RecipeTypeError(f"{file}: {where} weights = {phase['weights']!r} must be an inline table, "
                                  "e.g. weights = { web = 0.7, code = 0.3 }")
        for name, w in sorted(phase["weights"].items()):
            _check_type(file, f"{where} weights", name, w, _NUMBER)
        out.append((phase[starts[0]], dict(phase["weights"])))
    if len(units) > 1:
        raise RecipeKeyError(f"{file}: [[mixture.schedule]] mixes step = and chunk = starts; use one kind")
    unit = units.pop()
    try:
        parse_schedule(out, [d.name for d in datasets], unit)
    except ConfigError as exc:
        raise RecipeError(f"{file}: [[mixture.schedule]]: {exc}") from None
    return tuple(out), unit


def _options(file: str, table: dict) -> dict[str, Any]:
    if "client" in table:
        raise RecipeKeyError(
            f"{file}: [options] client cannot be set in a recipe (it is a live dask Client); "
            'use address = "tcp://scheduler:8786", or pass client= to Pipeline.options in Python'
        )
    _check_known(file, "[options]", table, sorted(OPTION_TYPES))
    for key in sorted(table):
        if key in OPTION_TYPES:
            _check_type(file, "[options]", key, table[key], OPTION_TYPES[key])
    return table
