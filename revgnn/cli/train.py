"""``revgnn-train``: the Hydra entry point of the one training loop (:mod:`revgnn.engine.loop`).

    revgnn-train                                          # small RevGNN on generated proteins_like
    revgnn-train experiment=proteins_revgnn_deep          # the paper's 1001-layer RevGNN
    revgnn-train -m experiment=proteins_revgnn_deep seed=0,1,2,3,4,5,6,7,8,9
    revgnn-train experiment=molhiv_revgnn_graphnorm       # graph-level: RevGNN + GraphNorm on ogbg-molhiv
    revgnn-train trainer.epochs=5 ckpt_path=outputs/.../last.pt                       # resume
    revgnn-train data=pyg_file data.path=graph.pt model=revgnn_small   # a torch.save'd PyG Data
    revgnn-train --config-dir myconf data=my_graph     # myconf/data/my_graph.yaml names your loader
    torchrun --nproc_per_node=2 -m revgnn.train backend=ddp                          # data-parallel
    torchrun --nproc_per_node=4 -m revgnn.train backend=sar backend.partition_dir=parts/pl4  # SAR

This module's top level imports only Hydra and the config schemas: ``--help`` and ``--cfg job`` do not
import torch or PyG.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Dict

import hydra
from omegaconf import DictConfig

from revgnn.config.store import register_configs

log = logging.getLogger("revgnn.train")

# the schemas and model options that train.yaml composes with, stored before Hydra runs main
register_configs()


def train(cfg: DictConfig) -> Dict[str, Any]:
    """Runs one training job (:func:`revgnn.engine.loop.train`); returns the summary."""
    from revgnn.engine.loop import train as run

    return run(cfg)


@hydra.main(version_base="1.3", config_path="pkg://revgnn.configs", config_name="train")
def main(cfg: DictConfig) -> float:
    """Hydra entry point; returns the best validation score for sweepers. On SIGINT / SIGTERM the
    loop saves ``last.pt`` and this exits with ``128 + signal`` after printing how to resume; a
    :class:`~revgnn.errors.ConfigError` (bad input, refused before training) is printed alone and
    exits with 2; a divergence (:class:`~revgnn.engine.divergence.TrainingDiverged`: ``summary.json``
    says ``diverged``) or a failed operation between workers
    (:class:`~revgnn.distributed.comm.SARCommError`, naming the peer) is printed alone and exits with 1."""
    from hydra.errors import InstantiationException

    from revgnn.distributed.comm import SARCommError
    from revgnn.engine.divergence import TrainingDiverged
    from revgnn.engine.interrupt import TrainingInterrupted
    from revgnn.errors import ConfigError

    try:
        return train(cfg)["highest_valid"]
    except TrainingInterrupted as e:
        log.error("%s", e)
        sys.exit(e.exit_code)
    except (TrainingDiverged, SARCommError) as e:  # its message says all (no traceback per worker)
        log.error("%s", e)
        sys.exit(1)
    except ConfigError as e:
        log.error("%s", e)
        sys.exit(2)
    except InstantiationException as e:  # a loader (a user's own, or a file it reads) refused its input
        log.error("%s", instantiation_message(e))
        sys.exit(2)


def instantiation_message(e: BaseException) -> str:
    """One line for a failure inside what a config's ``_target_`` built (Hydra's message names the
    target; the cause says what failed): the cause's message alone when it is a
    :class:`~revgnn.errors.ConfigError` (a loader's own check), else the target and the cause."""
    from revgnn.errors import ConfigError

    cause = e.__cause__
    if isinstance(cause, ConfigError):
        return str(cause)
    head = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if cause is None:
        return head
    target = head.split("'")[1] if head.count("'") >= 2 else "its _target_"
    return f"{target} failed: {type(cause).__name__}: {cause}"


def cli() -> None:
    """``revgnn-train``: re-executes once with tcmalloc preloaded when it is installed (flat peak
    RSS in depth, faster steps; ``REVGNN_ALLOCATOR=system`` opts out), checks the command line
    (:func:`revgnn.cli.overrides.prepare`: one message and exit 2 for a mistake, path values
    quoted for Hydra), then runs :func:`main`. Under
    ``torchrun`` the ranks first agree on one run directory and only rank 0 writes Hydra's files and
    ``train.log`` (:func:`revgnn.distributed.torchrun.worker_overrides`)."""
    from revgnn.cli import refuse
    from revgnn.cli.launcher import check_launcher
    from revgnn.cli.overrides import prepare
    from revgnn.distributed.torchrun import worker_overrides
    from revgnn.errors import ConfigError
    from revgnn.utils.allocator import use_tcmalloc

    try:  # Hydra would only say it cannot load the launcher's config
        check_launcher(sys.argv[1:])
    except ConfigError as e:
        refuse(e)
    use_tcmalloc()
    try:  # every mistake on the command line: one message, exit 2, before Hydra or the data
        sys.argv[1:] = prepare(sys.argv[1:])
    except ConfigError as e:
        refuse(e)
    sys.argv += worker_overrides()
    main()


if __name__ == "__main__":
    cli()
