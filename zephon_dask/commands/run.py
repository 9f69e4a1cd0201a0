"""``zephon-dask run RECIPE --steps N``: stream a recipe's batches with a progress bar.

A global step is ``--global-batches-per-step`` batches over all ranks (else
the recipe's setting, else one batch per lane). With ``--resume`` it comes
from the checkpoint: the recipe's per-rank ``batches_per_step`` was written
for one DP degree, so it gives way to the checkpoint's count.

SIGINT (Ctrl-C) and SIGTERM (a scheduler's preemption) stop the run where it
is: the checkpoint of the last completed global step is written (with
``--checkpoint``), one line says so, and the exit status is 130 or 143.
``--checkpoint-every N`` also writes it every N global steps.

Exit statuses: 0 after ``--steps`` steps, 1 when the stream ended before, 2
on a data or configuration error (one line), 3 on any other exception (its
traceback), 130 and 143 after SIGINT and SIGTERM.
"""

from ..options import BY_NAME as OPTIONS
from . import count, fail, positive_int, writable_dir, writable_file

UNEXPECTED = 3  # the exit status of an error that is not a data or configuration error
HELP = "stream a recipe's batches for N global steps (progress, throughput, ledger, checkpoint)"


def add_arguments(parser) -> None:
    parser.add_argument("recipe", help="a TOML recipe (see docs/recipes.md)")
    parser.add_argument("--steps", type=positive_int, required=True, help="global steps to stream")
    parser.add_argument("--resume", help="a checkpoint written by --checkpoint (or save_state) to start from")
    parser.add_argument("--checkpoint", help="write the state here after the last step (and when interrupted)")
    parser.add_argument("--checkpoint-every", type=positive_int, metavar="N",
                        help="also write --checkpoint every N global steps")
    parser.add_argument("--ledger", help="append a ledger line per batch to DIR/rank-<n>.jsonl")
    parser.add_argument("--runner", choices=OPTIONS["runner"].choices,
                        help="override the recipe's runner")
    parser.add_argument("--address", help="an existing Dask scheduler to run on")
    parser.add_argument("--dp-degree", type=positive_int, help="DP groups (default: the recipe's, else 1)")
    parser.add_argument("--dp-group-id", type=count, help="this DP group (default: the recipe's, else 0)")
    parser.add_argument("--global-batches-per-step", type=positive_int, metavar="G",
                        help="batches in one global step over all DP groups, a multiple of "
                             "canonical_replicas (default: the checkpoint's with --resume, else the "
                             "recipe's, else canonical_replicas)")


class _Run:
    """One ``run``: streams steps and writes the checkpoint. Holds the steps done."""

    def __init__(self, pipeline, args, stop):
        self.pipeline, self.args, self.stop = pipeline, args, stop
        self.done = 0

    def stream(self) -> None:
        import time

        from tqdm import tqdm

        per_step = self.pipeline.session.step_shape().per_rank
        every = self.args.checkpoint_every
        batches = iter(self.pipeline)
        started = time.perf_counter()
        # the rate shown is real (unpadded) tokens per second since the start, not steps per second
        with tqdm(total=self.args.steps, desc="global steps", unit="step",
                  bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]") as bar:
            for _ in range(self.args.steps):
                for _ in range(per_step):
                    if next(batches, None) is None:
                        bar.write(f"the stream ended after {self.done} full steps")
                        return
                self.done += 1
                progress = self.pipeline.session.current_progress()
                bar.set_postfix_str(f"{tokens_per_s(progress.tokens, time.perf_counter() - started)} tokens/s",
                                    refresh=False)
                bar.update(1)
                if every and self.args.checkpoint and self.done % every == 0:
                    self.save(self.pipeline.state_dict())

    def last_step_state(self) -> dict:
        """The state at the end of the last completed global step (the consumed position when the
        step began further back than a state can be rewound)."""
        from ..errors import StateError

        completed = self.pipeline.session.current_progress().global_step
        try:
            return self.pipeline.state_dict(at_step=completed)
        except StateError:
            return self.pipeline.state_dict()

    def save(self, state: dict) -> None:
        from ..state import save_state

        with self.stop.deferred():  # a signal now waits for the file to be complete
            save_state(self.args.checkpoint, state)


def tokens_per_s(tokens: int, seconds: float) -> str:
    """``12,345``: the rate the bar shows (``0`` before any time has passed)."""
    return f"{tokens / seconds:,.0f}" if seconds > 0 else "0"


def run(args) -> int:
    from ..errors import ZephonError
    from ..log import dashboard_link_shown
    from ..pipeline import Pipeline
    from ..preemption import Preempted, Preemption
    from ..state import State, load_state

    if args.checkpoint_every and not args.checkpoint:
        return fail("run", ValueError("--checkpoint-every needs --checkpoint PATH (where to write)"))
    try:  # paths first: a run must not stream for minutes and then fail to write its results
        if args.checkpoint:
            writable_file(args.checkpoint, "--checkpoint")
        if args.ledger:
            writable_dir(args.ledger, "--ledger")
    except OSError as exc:
        return fail("run", exc)
    with Preemption(at_once=True) as stop:
        try:
            pipeline = Pipeline.from_config(args.recipe)
            overrides = {"dp_degree": args.dp_degree, "dp_group_id": args.dp_group_id, "runner": args.runner,
                         "address": args.address, "ledger": args.ledger}
            pipeline = pipeline.options(**{k: v for k, v in overrides.items() if v is not None})
            if args.global_batches_per_step is not None:
                pipeline = pipeline.options(batches_per_step=None,
                                            global_batches_per_step=args.global_batches_per_step)
            if args.resume:
                state = load_state(args.resume)
                if args.global_batches_per_step is None:
                    pipeline = pipeline.options(batches_per_step=None)  # per rank, for the recipe's degree
                pipeline.load_state_dict(state)
            shape = pipeline.session.step_shape()
            print(f"global step: {shape.global_batches} batches, {shape.per_rank} per rank "
                  f"at dp_degree={shape.dp_degree}")
            with dashboard_link_shown(), pipeline:  # the link once, when the cluster starts
                job = _Run(pipeline, args, stop)
                try:
                    job.stream()
                except Preempted as exc:
                    return _interrupted(job, exc)
                print(pipeline.stats())
                if args.checkpoint:  # a stream that ended mid-step: that step's batches are not consumed
                    state = job.last_step_state()
                    job.save(state)
                    print(f"checkpoint at global step {State.from_dict(state).step.global_step} -> {args.checkpoint}")
        except Preempted as exc:  # before the stream began: nothing to save
            print(f"zephon-dask run: {exc}", flush=True)
            return exc.exit_code
        except (ZephonError, OSError) as exc:
            return fail("run", exc)
        except Exception:  # a bug (in a user's function, or ours): its traceback, and a status of its own
            import sys
            import traceback

            traceback.print_exc()
            print("zephon-dask run: stopped by the unexpected error above", file=sys.stderr)
            return UNEXPECTED
    return 0 if job.done == args.steps else 1


def _interrupted(job: _Run, exc) -> int:
    """Write the checkpoint of the last completed step (with ``--checkpoint``); one line; the status."""
    where = ""
    if job.args.checkpoint:
        from ..state import State

        state = job.last_step_state()
        job.save(state)
        where = f": checkpoint at global step {State.from_dict(state).step.global_step} -> {job.args.checkpoint}"
    print(f"\nzephon-dask run: {exc} after {job.done} of {job.args.steps} steps{where}", flush=True)
    return exc.exit_code
