"""What the ranks of one ``torchrun`` job settle before Hydra starts in each of them.

Every rank runs ``revgnn-train``'s Hydra entry point, so without this each would name its own
``outputs/<name>/<time>`` directory from its own start time (ranks that start in different seconds
make two directories: rank 0's with the run's files, another with a second ``.hydra/`` and
``train.log``), and every rank would write the same log lines to the console and to one
``train.log``. :func:`worker_overrides`:

* shares rank 0's start time with every rank through the store the ``torchrun`` agent hosts
  (``TORCHELASTIC_USE_AGENT_STORE``; the key lives in that store, beside the process group's), as
  ``REVGNN_RUN_STAMP``, which the run directory of ``hydra/default.yaml`` uses;
* returns the Hydra overrides of ranks other than 0: no ``.hydra/`` output and
  ``hydra/job_logging=worker`` (warnings and errors to the console, tagged with the rank, no
  ``train.log``). Rank 0 writes the run's files, as the training loop does.

Outside ``torchrun`` (no ``RANK`` or a world of one) it does nothing.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import List

__all__ = ["RUN_STAMP_ENV", "STAMP_FORMAT", "worker_overrides"]

RUN_STAMP_ENV = "REVGNN_RUN_STAMP"
STAMP_FORMAT = "%Y-%m-%d_%H-%M-%S"  # as hydra/default.yaml's ${now:...}
_KEY = "revgnn/run_stamp"


def _share_stamp(rank: int, timeout_s: float) -> str:
    """Rank 0's start time, read by every rank from the agent's store."""
    from torch.distributed import TCPStore

    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not addr or not port:
        raise RuntimeError(
            "torchrun set TORCHELASTIC_USE_AGENT_STORE but not MASTER_ADDR / MASTER_PORT: cannot reach "
            "its store to agree on the run directory; pass output_dir=... to name it yourself"
        )
    store = TCPStore(addr, int(port), is_master=False, timeout=timedelta(seconds=timeout_s))
    if rank == 0:
        store.set(_KEY, time.strftime(STAMP_FORMAT))
    try:
        return store.get(_KEY).decode()
    except RuntimeError as e:  # the store's timeout
        raise RuntimeError(
            f"rank {rank}: rank 0 did not publish the run directory's time stamp within {timeout_s:.0f} s "
            f"(store {addr}:{port}); check rank 0's log, or pass output_dir=... ({e})"
        ) from None


def worker_overrides(timeout_s: float = 600.0) -> List[str]:
    """Under ``torchrun`` with more than one rank: agrees on the run directory's time stamp (sets
    ``REVGNN_RUN_STAMP`` unless it is set already) and returns the extra Hydra overrides of this
    rank (none for rank 0). ``timeout_s`` bounds the wait for rank 0, whose start-up may be slow on a
    busy machine."""
    rank, world = os.environ.get("RANK"), int(os.environ.get("WORLD_SIZE", "1") or 1)
    if rank is None or world < 2:
        return []
    rank = int(rank)
    if RUN_STAMP_ENV not in os.environ and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        os.environ[RUN_STAMP_ENV] = _share_stamp(rank, timeout_s)
    return [] if rank == 0 else ["hydra.output_subdir=null", "hydra/job_logging=worker"]
