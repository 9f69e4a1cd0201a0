"""``zephon-dask explain RECIPE``: print the plan of a recipe's pipeline (no cluster is started)."""

from . import count, fail, positive_int

HELP = "print what a recipe's pipeline will do: datasets, mixture, lanes, operators, warnings"


def add_arguments(parser) -> None:
    parser.add_argument("recipe", help="a TOML recipe (see docs/recipes.md)")
    parser.add_argument("--dp-degree", type=positive_int, default=None,
                        help="explain for this many DP groups (default: the recipe's options, else 1)")
    parser.add_argument("--dp-group-id", type=count, default=None,
                        help="explain for this DP group (default: the recipe's options, else 0)")
    parser.add_argument("--count-steps", action="store_true",
                        help="count the global steps of a pass when that needs the windows computed "
                             "(reads, tokenizes and packs the whole stream here, once)")


def run(args) -> int:
    from ..errors import ConfigError, ZephonError
    from ..pipeline import Pipeline

    try:
        pipeline = Pipeline.from_config(args.recipe)
        identity = {"dp_degree": args.dp_degree, "dp_group_id": args.dp_group_id}
        pipeline = pipeline.options(**{k: v for k, v in identity.items() if v is not None})
        if args.count_steps and pipeline.spec.source.num_chunks is not None:
            try:
                pipeline.num_steps()  # cached: explain() shows it
            except ConfigError:
                pass  # an invalid step at this degree: explain() says why
        print(pipeline.explain())
    except ZephonError as exc:
        return fail("explain", exc)
    return 0
