"""``zephon-dask demo``: the demo job (package :mod:`zephon_dask_demo`) on an embedded LocalCluster.

The demo lives outside the library; it is imported only when this command runs.
"""

from . import fail, positive_int

HELP = "train a small LM on a stdlib corpus, checkpoint, resume on another DP degree, verify"


def add_arguments(parser) -> None:
    parser.add_argument("--workdir", default=".zephon-demo",
                        help="where the corpus, tokenizer, checkpoint and ledgers go (corpus and tokenizer are cached)")
    parser.add_argument("--steps", type=positive_int, default=40, help="global training steps in all (default 40)")
    parser.add_argument("--resume-at", type=positive_int, default=None,
                        help="global step of the checkpoint (default: half of --steps)")
    parser.add_argument("--dp-after", type=positive_int, default=2,
                        help="data-parallel degree after the resume: 1, 2 or 4 (default 2)")
    parser.add_argument("--max-files", type=positive_int, default=400,
                        help="stdlib modules to build the corpus from (default 400: all of them)")


def run(args) -> int:
    from zephon_dask_demo import run as run_demo

    from ..errors import ConfigError

    try:
        return run_demo(args.workdir, args.steps, args.resume_at, args.dp_after, args.max_files)
    except ConfigError as exc:
        return fail("demo", exc)
