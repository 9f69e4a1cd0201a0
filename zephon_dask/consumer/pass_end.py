"""Where a finite stream's pass ends with ``drop_last_step``: on a whole global step. Pure.

A global step holds ``per_lane`` batches of every lane. :class:`PassEnd`
says how many steps a pass has when that is known up front (rows are
samples: from the curriculum, the same for every DP group); otherwise a
stream finds its own lanes' last whole step by looking ahead, and the DP
groups settle the pass's end together with a :class:`StepAgreement`: at each
global step's start every group says whether it holds the step whole, and
the step is served only if every group does. The pass then ends on the last
step *every lane* completes, the same at every DP degree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# said where a pass ends when DP groups share the lanes and no vote could be held
UNAGREED = ("This DP group ended on its own lanes' last whole step: without torch.distributed the groups "
            "cannot vote on the pass's end, so it depends on the DP degree (run the groups under torchrun).")
KEEP_EVERY_SAMPLE = "To keep every sample, with a shorter last step, set .options(drop_last_step=False)"


@dataclass(frozen=True)
class PassEnd:
    """Where a pass ends with ``drop_last_step``: on a whole global step of ``per_lane`` batches
    of every lane. ``steps``: the pass's whole steps when known up front (else the stream looks
    ahead); ``dropped``: the batches of the stream's lanes after them, when known; ``per_rank``:
    the batches of one step here (for the warning)."""

    per_lane: int
    per_rank: int
    steps: int | None = None
    dropped: int | None = None


class StepAgreement:
    """The DP groups' vote on each global step of a pass whose end is not known up front.

    ``vote(flag)`` is a collective: every group calls it once per global step,
    in the same order, and it returns whether ``flag`` was true in every group.
    :meth:`admit` is called with each delivery this group could make (``have``:
    a batch is there); at a step's start it votes, and mid-step, a group that
    ran out votes for the next step at once, so no group waits on a vote that
    never comes. ``at``: the deliveries already made in the current step (a
    resume mid-step votes at the next step's start).
    """

    def __init__(self, vote: Callable[[bool], bool], per_rank: int, at: int = 0):
        self.vote, self.per_rank, self.at = vote, per_rank, at % per_rank
        self.ended = False

    def admit(self, have: bool) -> bool:
        """Whether this group serves the delivery it has (``have``); False once the pass ended."""
        if self.ended:
            return False
        if (self.at == 0 or not have) and not self.vote(have):
            self.ended = True
            return False
        if not have:  # every group voted yes to a step this group cannot serve: it has none left
            self.ended = True
            return False
        self.at = (self.at + 1) % self.per_rank
        return True
