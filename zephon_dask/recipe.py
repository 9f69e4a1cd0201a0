"""TOML recipes: a pipeline described in a file (reference: ``docs/recipes.md``).

:func:`load_recipe` reads a recipe and checks its tables, keys, TOML types and
that the local paths it names exist, then returns an immutable
:class:`Recipe`; it opens no dataset. :meth:`Recipe.pipeline` builds the
datasets (indexing their files) and the :class:`~zephon_dask.pipeline.Pipeline`.
Values are checked by the same constructors as in Python, so a recipe and the
equivalent hand-built pipeline have the same fingerprint.

Relative paths (datasets, a ``tokenizer.json``) are relative to the recipe's
folder; URLs (anything with ``://``) are used as written.
"""

from __future__ import annotations

import difflib
import glob
import os
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from .curriculum import MixtureWorkSource
from .curriculum.schedule import parse as parse_schedule
from .data import Dataset
from .data.formats import READERS
from .data.formats import get as format_reader
from .data.paths import has_glob
from .errors import ConfigError, RecipeError, RecipeKeyError, RecipePathError, RecipeTypeError
from .options import BY_NAME as OPTIONS
from .pipeline import Pipeline
from .views import register


def dataset_formats() -> tuple[str, ...]:
    """The formats a recipe may name: every registered format but in-memory records."""
    return tuple(f for f in READERS if f != "records")


_INT, _BOOL, _STR = (int,), (bool,), (str,)
_NUMBER = (int, float)

DATASET_KEYS = {"name": _STR, "path": _STR, "format": _STR, "text_field": _STR, "weight": _NUMBER,
                "storage_options": (dict,)}
SECRET_KEYS = ("storage_options",)  # values never echoed in a message: they may hold credentials
DATASET_REQUIRED = ("name", "path")

# table -> key -> accepted TOML types; keys are the keyword arguments of the
# matching constructor or Pipeline method.
TABLES: dict[str, dict[str, tuple[type, ...]]] = {
    "source": {  # MixtureWorkSource
        "chunk_size": _INT, "seed": _INT, "shuffle_shards": _BOOL, "shuffle_within_shard": _BOOL,
        "shuffle_block_size": _INT, "stop_after_passes": _INT, "exhausted_policy": _STR,
        "max_repeats": _INT, "reshuffle_on_repeat": _BOOL, "lane_assignment": _STR, "weight_by": _STR,
    },
    "tokenize": {  # Pipeline.tokenize
        "tokenizer": _STR, "field": _STR, "bos": _BOOL, "eos": _BOOL, "max_length": _INT,
        "split_long": _BOOL, "bos_id": (int, str), "eos_id": (int, str),
    },
    "shuffle": {"buffer_size": _INT, "seed": _INT},  # Pipeline.shuffle
    "pack": {"max_length": _INT, "algorithm": _STR, "pad_id": _INT, "num_bins": _INT},  # Pipeline.pack
    "batch": {  # Pipeline.batch
        "microbatch_size": _INT, "drop_last": _BOOL, "labels": (bool, str), "ignore_index": _INT,
        "mask_document_boundaries": _BOOL, "cu_seqlens": _BOOL,
    },
}
REQUIRED = {"shuffle": ("buffer_size",), "pack": ("max_length",), "batch": ("microbatch_size",)}
# [options] takes every option a recipe can set (all but client, a live object), typed as its
# definition says (zephon_dask.options); the values are then checked by Pipeline.options.
OPTION_TYPES: dict[str, tuple[type, ...]] = {o.name: o.toml for o in OPTIONS.values() if o.toml is not None}
TOP_LEVEL = ("datasets", "mixture", *TABLES, "options")
SCHEDULE_KEYS = ("step", "chunk", "weights")  # one [[mixture.schedule]] table: a start and the weights

_TYPE_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string",
               dict: "an inline table"}
_EXAMPLES = {int: "8", float: "0.5", bool: "true", str: '"..."', dict: '{ endpoint_url = "..." }'}


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

    def pipeline(self):
        """Open the datasets and build the pipeline: tokenize, then shuffle, then pack, then batch."""
        datasets = []
        for i, entry in enumerate(self.datasets):
            with _context(self.path, f"[[datasets]] #{i + 1} (name {entry.name!r})"):
                datasets.append(entry.open())
        with _context(self.path, "[source], [mixture] and the datasets' weights"):
            schedule = None if self.schedule is None else list(self.schedule)
            pipeline = Pipeline(MixtureWorkSource(datasets, self.weights, **self.source, schedule=schedule,
                                                  schedule_unit=self.schedule_unit))
        for name in ("tokenize", "shuffle", "pack", "batch"):
            kwargs = getattr(self, name)
            if kwargs is not None:
                with _context(self.path, f"[{name}]"):
                    pipeline = getattr(pipeline, name)(**kwargs)
        with _context(self.path, "[options]"):
            return pipeline.options(**self.options)


@contextmanager
def _context(file: str, where: str) -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        exc.add_note(f"zephon_dask: in recipe {file}, {where}")
        raise


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
        pack=tables["pack"],
        batch=tables["batch"],
        options=_options(file, _table(file, "options", doc.get("options")) or {}),
    )


# -- checks ----------------------------------------------------------------------------


def _check_known(file: str, where: str, table: dict, known, what: str = "key") -> None:
    for key in sorted(table):
        if key not in known:
            close = difflib.get_close_matches(key, list(known), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise RecipeKeyError(
                f"{file}: {where} has an unknown {what} {key!r}; {hint}known: {', '.join(known)}"
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
        raise RecipePathError(
            f"{file}: {where} {key} = {value!r} does not exist (looked for {resolved!r}); "
            "relative paths start at the recipe's folder: fix the path or create the data"
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


@register("pipeline_from_config")
def pipeline_from_config(path: str | os.PathLike) -> Pipeline:
    """``Pipeline.from_config(path)``: the pipeline the recipe at ``path`` describes."""
    return load_recipe(path).pipeline()
