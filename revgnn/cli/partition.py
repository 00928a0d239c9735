"""``revgnn-partition``: partitions a node-level data set of the ``data`` group for SAR, one
checked file per worker (:mod:`revgnn.distributed.partition`, the format:
:mod:`revgnn.distributed.part_files`).

Command line (Hydra; ``data`` is the same config group as ``revgnn-train``'s)::

    revgnn-partition data=proteins_like num_parts=4 out=parts/pl4
    revgnn-partition data=ogbn_proteins data.root=/data num_parts=8 \
        out=parts/p8
    torchrun --nproc_per_node=4 -m revgnn.train backend=sar \
        backend.partition_dir=parts/pl4
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum
from typing import Any

from omegaconf import MISSING

__all__ = ["PartitionMethod", "PartitionConfig", "register_partition_config", "partition_from_config", "main"]


class PartitionMethod(str, Enum):
    """``metis``: minimum edge cut (``pymetis``). ``random``: uniform."""

    metis = "metis"
    random = "random"


@dataclass
class PartitionConfig:
    """Schema of ``revgnn-partition`` (``revgnn/configs/partition.yaml``).

    Attributes:
        data: a node-level option of the ``data`` group, as for
            ``revgnn-train`` (``proteins_like``, ``ogbn_proteins``, ...).
        num_parts: number of SAR workers :math:`P` (one part file each).
        method: ``metis`` or ``random``.
        seed: seed of the partitioner.
        out: directory for ``part_{p}.pt`` and ``meta.json``.
    """

    data: Any = MISSING
    num_parts: int = MISSING
    method: PartitionMethod = PartitionMethod.metis
    seed: int = 0
    out: str = MISSING


def register_partition_config() -> None:
    """Stores :class:`PartitionConfig` (and the ``data`` schemas) in Hydra's
    ConfigStore as ``partition_schema`` (idempotent)."""
    from hydra.core.config_store import ConfigStore

    from revgnn.config.store import register_configs

    register_configs()  # the data group's schemas
    ConfigStore.instance().store(name="partition_schema", node=PartitionConfig)


def partition_from_config(cfg: Any) -> dict:
    """Runs a composed ``partition.yaml``: instantiates ``cfg.data`` and
    calls :func:`~revgnn.distributed.partition.partition_dataset`; returns its statistics."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from revgnn.distributed.partition import partition_dataset

    for key, example in (("num_parts", "num_parts=4"), ("out", "out=parts/pl4")):
        if OmegaConf.is_missing(cfg, key):
            raise ValueError(f"{key} is required, e.g. {example}")
    if cfg.num_parts < 1:
        raise ValueError(f"num_parts must be >= 1, got {cfg.num_parts}")
    return partition_dataset(
        instantiate(cfg.data),
        cfg.out,
        cfg.num_parts,
        cfg.method.value,
        cfg.seed,
        OmegaConf.to_container(cfg.data, resolve=True),
    )


def main() -> None:
    """``revgnn-partition``: partitions a data set of the ``data`` group and
    prints the statistics of
    :func:`~revgnn.distributed.partition.partition_dataset` as one JSON line."""
    import hydra

    register_partition_config()

    @hydra.main(version_base="1.3", config_path="pkg://revgnn.configs", config_name="partition")
    def run(cfg) -> None:
        print(json.dumps(partition_from_config(cfg)))

    run()


if __name__ == "__main__":
    main()
