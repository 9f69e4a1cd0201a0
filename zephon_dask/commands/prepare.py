"""``zephon-dask prepare RECIPE --out PATH``: tokenize a recipe's datasets into token stores.

Reads the recipe (see ``docs/recipes.md``) with :func:`zephon_dask.recipe.load_recipe`,
uses its ``[[datasets]]`` and ``[tokenize]`` tables, builds the ``Tokenize`` operator
(``field`` defaults to each dataset's text field) and runs ``prepare_tokens`` for each
dataset on one Dask cluster, writing ``<out>/<name>``. Datasets that already
are token stores are skipped. Other recipe tables are ignored here. A dataset name
that would leave ``--out`` (absolute, ``..``, a backslash) is refused before anything runs.
"""

import posixpath

from . import fail, positive_int

HELP = "tokenize a recipe's datasets once, on a Dask cluster, into zarr token stores"

def add_arguments(parser) -> None:
    parser.add_argument("recipe", help="TOML recipe with [[datasets]] and [tokenize]")
    parser.add_argument("--out", required=True,
                        help="folder or fsspec URL; each dataset's store goes to OUT/<name>")
    parser.add_argument("--workers", type=positive_int, default=None,
                        help="workers of the embedded LocalCluster (default: all cores)")
    parser.add_argument("--address", default=None,
                        help="scheduler address of a running Dask cluster (instead of a local one)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")


def store_path(out: str, name: str) -> str:
    """``<out>/<name>``, or a :class:`ConfigError` when ``name`` would lead outside ``out``. Pure."""
    from ..errors import ConfigError

    parts = name.split("/")
    if not name or name.startswith("/") or "\\" in name or ":" in name or any(p in ("", ".", "..") for p in parts):
        raise ConfigError(
            f"dataset name {name!r} cannot name a store under --out {out!r}: it would leave that folder "
            "(absolute, '..', '.', an empty part, a backslash or a colon); rename the dataset, e.g. 'web' "
            "or 'web/en'"
        )
    return posixpath.join(out.rstrip("/"), name)


def _read_recipe(path: str):
    """``(datasets, tokenize settings)``: the two parts of the recipe ``prepare`` uses."""
    from ..errors import ConfigError
    from ..recipe import load_recipe

    recipe = load_recipe(path)
    tokenize = dict(recipe.tokenize or {})
    if tokenize.pop("split_long", False):
        raise ConfigError(
            f"recipe {path!r}: [tokenize] split_long = true cannot be prepared (a token store "
            "keeps one document per record); drop it or use max_length truncation"
        )
    tokenize.setdefault("tokenizer", "bytes")
    return [entry.open() for entry in recipe.datasets], tokenize


def run(args) -> int:
    import tomllib

    from ..errors import ZephonError
    from ..execution.connect import connect
    from ..jobs import prepare_tokens
    from ..operators import Tokenize

    try:
        datasets, tokenize = _read_recipe(args.recipe)
        todo = [d for d in datasets if d.format != "tokens"]
        for d in datasets:
            if d.format == "tokens":
                print(f"{d.name}: already a token store, skipped")
        if not todo:
            return 0
        outs = {d.name: store_path(args.out, d.name) for d in todo}  # every name checked first
        ops = {d.name: Tokenize(**{"field": d.text_field, **tokenize}) for d in todo}
        with connect(address=args.address, n_workers=args.workers) as client:
            for d in todo:
                r = prepare_tokens(d, ops[d.name], outs[d.name], client=client,
                                   progress=not args.no_progress)
                print(f"{d.name}: {r.num_docs:,} documents, {r.num_tokens:,} tokens -> {r.path} "
                      f"({len(r.computed)} shards tokenized, {len(r.reused)} verified and kept, "
                      f"{r.seconds:.1f} s)")
    except (ZephonError, OSError, tomllib.TOMLDecodeError) as exc:
        return fail("prepare", exc)
    return 0
