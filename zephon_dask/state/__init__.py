"""Checkpoints: the typed state and its schema, progress tracking, merging, files and the run ledger."""

from .files import load_state, save_state
from .ledger import batch_digest, read_ledger, verify_ledgers
from .merge import gather_state, merge_states
from .schema import FORMAT, VERSION, LaneProgress, State, StepProgress, check_state, pointer_key

__all__ = [
    "FORMAT",
    "LaneProgress",
    "State",
    "StepProgress",
    "VERSION",
    "batch_digest",
    "check_state",
    "gather_state",
    "load_state",
    "merge_states",
    "pointer_key",
    "read_ledger",
    "save_state",
    "verify_ledgers",
]
