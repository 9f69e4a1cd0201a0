"""``zephon-dask demo``: the main job on an embedded LocalCluster."""

HELP = "stream a stdlib corpus on an embedded LocalCluster"


def add_arguments(parser) -> None:
    parser.add_argument("--workdir", default=".zephon-demo", help="where the corpus is cached")
    parser.add_argument("--steps", type=int, default=40, help="global steps to stream")


def run(args) -> int:
    from ..demo import run as run_demo

    return run_demo(args.workdir, args.steps)
