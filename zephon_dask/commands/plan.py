"""``zephon-dask plan RECIPE --dp 1,2,4,8``: which DP group owns which lanes, per degree and mapping.

Only the recipe's ``[options]`` matter here, so no dataset is opened.
"""

import argparse

from ..options import BY_NAME as OPTIONS
from . import fail

HELP = "print the lane-to-group table of a recipe for several data-parallel degrees"
MAPPINGS = OPTIONS["mapping_strategy"].choices


def degrees(text: str) -> tuple[int, ...]:
    """``"1,2,4,8"`` -> ``(1, 2, 4, 8)``."""
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of positive ints, e.g. 1,2,4,8")
    return values


def add_arguments(parser) -> None:
    parser.add_argument("recipe", help="a TOML recipe (see docs/recipes.md)")
    parser.add_argument("--dp", type=degrees, default=(1, 2, 4, 8), metavar="N,N,...",
                        help="data-parallel degrees to plan for (default: 1,2,4,8)")
    parser.add_argument("--mapping", choices=MAPPINGS, default=None,
                        help="lane-to-group mapping to show (default: both)")


def run(args) -> int:
    from ..errors import ZephonError
    from ..inspect import lane_plans
    from ..recipe import load_recipe

    try:
        options = load_recipe(args.recipe).options
        replicas = options.get("canonical_replicas", OPTIONS["canonical_replicas"].default)
        mappings = MAPPINGS if args.mapping is None else (args.mapping,)
        print(lane_plans(replicas, args.dp, mappings, options.get("batches_per_step"),
                         options.get("global_batches_per_step")))
    except ZephonError as exc:
        return fail("plan", exc)
    return 0
