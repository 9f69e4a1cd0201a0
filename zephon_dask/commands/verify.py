"""``zephon-dask verify DIR_A DIR_B``: do two runs' ledgers hold the same global steps?"""

HELP = "compare two run ledgers step by step (exit 0 when every shared global step matches)"


def add_arguments(parser) -> None:
    parser.add_argument("dir_a", help="ledger folder of run A (rank-<n>.jsonl files)")
    parser.add_argument("dir_b", help="ledger folder of run B")


def run(args) -> int:
    from ..errors import StateError
    from ..state.ledger import verify_ledgers
    from . import fail

    try:
        same, report = verify_ledgers(args.dir_a, args.dir_b)
    except StateError as exc:
        return fail("verify", exc)
    print(("OK: " if same else "DIFFERENT: ") + report)
    return 0 if same else 1
