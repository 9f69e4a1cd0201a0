"""Lightning DDP under Lightning's own launcher, for tests/integrations/test_integrations_lightning.py.

Started as ``python lightning_job.py --corpus C --out O``: ``Trainer(devices=2,
strategy="ddp")`` on CPU starts the second rank itself (it runs this script
again), so rank 0 never sees ``WORLD_SIZE``. Each rank fits ``STEPS // 2``
steps checkpointing every ``SAVE_AT // 2`` into ``O/full``, then fits again from
``O/full/step=3.ckpt`` into the same folder (Lightning saves step 3 again
after the first micro-batch, as ``step=3-v1.ckpt``), and writes what each fit
trained (``(global step, lane, index_in_lane, batch_idx)``) to ``O/rank-<r>.json``.

With ``--env-identity`` the pipeline takes its identity from ``WORLD_SIZE`` and
``RANK`` (unset on rank 0): every rank must refuse it; each writes the error to
``O/error-<local rank>.txt`` and exits with 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: tests.helpers

from tests.helpers.frameworks import (  # noqa: E402
    SAVE_AT,
    STEPS,
    end_process_group_after,
    hf_pipeline,
    lightning_fit,
)
from zephon_dask.errors import ConfigError  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--env-identity", action="store_true")
    args = ap.parse_args()
    out, kw = Path(args.out), {"devices": 2, "strategy": "ddp", "use_distributed_sampler": True}
    steps, every = STEPS // 2, SAVE_AT // 2
    if args.env_identity:
        env = {"dp_degree": int(os.environ.get("WORLD_SIZE", "1")), "dp_group_id": int(os.environ.get("RANK", "0"))}
        with hf_pipeline(Path(args.corpus), runner="threads", **env) as pipe:
            try:
                lightning_fit(pipe, out / "env", steps=steps, every=every, **kw)
            except ConfigError as e:
                (out / f"error-{os.environ.get('LOCAL_RANK', '0')}.txt").write_text(str(e))
                return 1
        return 0
    with hf_pipeline(Path(args.corpus), runner="threads") as pipe:
        full = lightning_fit(pipe, out / "full", steps=steps, every=every, **kw)
    with hf_pipeline(Path(args.corpus), runner="threads") as pipe:
        resumed = lightning_fit(pipe, out / "full", resume=str(out / "full" / f"step={every}.ckpt"), steps=steps,
                                every=every, **kw)
    rank = full.trainer.global_rank
    (out / f"rank-{rank}.json").write_text(json.dumps({"full": full.trained, "resumed": resumed.trained}))
    return 0


if __name__ == "__main__":
    raise SystemExit(end_process_group_after(main))
