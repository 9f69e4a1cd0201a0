"""``zephon-dask run RECIPE --steps N``: stream a recipe's batches with a progress bar.

A global step is ``--global-batches-per-step`` batches over all ranks (else
the recipe's setting, else one batch per lane). With ``--resume`` it comes
from the checkpoint: the recipe's per-rank ``batches_per_step`` was written
for one DP degree, so it gives way to the checkpoint's count.
"""

from . import count, fail, positive_int, writable_dir, writable_file

HELP = "stream a recipe's batches for N global steps (progress, throughput, ledger, checkpoint)"


def add_arguments(parser) -> None:
    parser.add_argument("recipe", help="a TOML recipe (see docs/recipes.md)")
    parser.add_argument("--steps", type=positive_int, required=True, help="global steps to stream")
    parser.add_argument("--resume", help="a checkpoint written by --checkpoint (or save_state) to start from")
    parser.add_argument("--checkpoint", help="write the state here after the last step")
    parser.add_argument("--ledger", help="append a ledger line per batch to DIR/rank-<n>.jsonl")
    parser.add_argument("--runner", choices=["distributed", "threads", "synchronous"],
                        help="override the recipe's runner")
    parser.add_argument("--address", help="an existing Dask scheduler to run on")
    parser.add_argument("--dp-degree", type=positive_int, help="DP groups (default: the recipe's, else 1)")
    parser.add_argument("--dp-group-id", type=count, help="this DP group (default: the recipe's, else 0)")
    parser.add_argument("--global-batches-per-step", type=positive_int, metavar="G",
                        help="batches in one global step over all DP groups, a multiple of "
                             "canonical_replicas (default: the checkpoint's with --resume, else the "
                             "recipe's, else canonical_replicas)")


def _stream(pipeline, steps: int) -> int:
    from tqdm import tqdm

    per_step = pipeline.step_shape().per_rank
    batches = iter(pipeline)
    done = 0
    with tqdm(total=steps, desc="global steps", unit="step") as bar:
        for _ in range(steps):
            for _ in range(per_step):
                batch = next(batches, None)
                if batch is None:
                    bar.write(f"the stream ended after {done} full steps")
                    return done
            done += 1
            bar.update(1)  # throughput: one figure, in the stats printed at the end
    return done


def run(args) -> int:
    from ..errors import ZephonError
    from ..recipe import load_recipe
    from ..state import load_state, save_state

    try:  # paths first: a run must not stream for minutes and then fail to write its results
        if args.checkpoint:
            writable_file(args.checkpoint, "--checkpoint")
        if args.ledger:
            writable_dir(args.ledger, "--ledger")
    except OSError as exc:
        return fail("run", exc)
    try:
        pipeline = load_recipe(args.recipe).pipeline()
        overrides = {"dp_degree": args.dp_degree, "dp_group_id": args.dp_group_id, "runner": args.runner,
                     "address": args.address, "ledger": args.ledger}
        pipeline.options(**{k: v for k, v in overrides.items() if v is not None})
        if args.global_batches_per_step is not None:
            pipeline.options(batches_per_step=None, global_batches_per_step=args.global_batches_per_step)
        if args.resume:
            state = load_state(args.resume)
            if args.global_batches_per_step is None:
                pipeline.options(batches_per_step=None)  # per rank, for the degree the recipe was written for
            pipeline.load_state_dict(state)
        shape = pipeline.step_shape()
        print(f"global step: {shape.global_batches} batches, {shape.per_rank} per rank "
              f"at dp_degree={shape.dp_degree}")
        with pipeline:
            done = _stream(pipeline, args.steps)
            print(pipeline.stats())
            if args.checkpoint:
                state = pipeline.state_dict()
                save_state(args.checkpoint, state)
                print(f"checkpoint at global step {state['step']['global_step']} -> {args.checkpoint}")
    except (ZephonError, OSError) as exc:
        return fail("run", exc)
    return 0 if done == args.steps else 1
