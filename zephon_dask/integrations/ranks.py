"""The pipeline state and identity over all ranks, for frameworks that save one rank's copy or
place the ranks themselves. Imports no framework; holds no state."""

from __future__ import annotations

from .. import torch_dist
from ..errors import ConfigError
from ..state import gather_state


def collective_state(pipeline) -> dict:
    """The pipeline's (consumed) state with every rank's lanes.

    A collective under an initialised ``torch.distributed`` with several
    ranks (every rank must call it; each gets the merged state), else the
    pipeline's own state.
    """
    if torch_dist.initialized(several=True) is not None:
        return gather_state(pipeline)
    return pipeline.state_dict()


def check_identity(pipelines: dict, replicas: int, replica: int, framework: str) -> None:
    """Refuse pipelines whose DP identity is not the framework's data-parallel replica.

    A collective under an initialised ``torch.distributed`` with several ranks
    (every rank must call it): every rank raises the same :class:`ConfigError`,
    so none is left waiting in the framework's next collective.

    Args:
        pipelines: ``{role: pipeline}`` (``"train"``, ``"val"``, ...).
        replicas: how many data-parallel replicas the framework trains.
        replica: this rank's replica (0 <= replica < replicas).
        framework: the framework's name, for the message.
    """
    mine = []
    for role, pipeline in pipelines.items():
        try:
            found = pipeline.session.identity()
        except ConfigError as e:
            found = str(e)
        if found != (replicas, replica):
            mine.append((role, found, replica))
    dist = torch_dist.initialized(several=True)
    ranks: list = [mine]
    if dist is not None:
        ranks = [None] * dist.get_world_size()
        dist.all_gather_object(ranks, mine)
    wrong = [(rank, *mismatch) for rank, mismatches in enumerate(ranks) for mismatch in mismatches]
    if not wrong:
        return
    rank, role, found, expected = wrong[0]
    got = (f"dp_degree={found[0]}, dp_group_id={found[1]}" if isinstance(found, tuple) else found)
    raise ConfigError(
        f"rank {rank}'s {role} pipeline takes {got}, but {framework} trains it as data-parallel "
        f"replica {expected} of {replicas} ({len(wrong)} mismatch(es) over the ranks). Leave dp_degree and dp_group_id unset: "
        f"the pipeline then takes them from torch.distributed, which {framework} starts before "
        "setup(); environment variables such as WORLD_SIZE and RANK are not set on every rank by "
        "every launcher. Set them only for tensor- or pipeline-parallel peers, to the data-parallel "
        "degree and group"
    )
