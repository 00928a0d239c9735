r"""Distributed full-graph training with SAR (sequential aggregation and
rematerialisation, Mostafa 2021) on :mod:`torch.distributed`.

* :mod:`.partition` — METIS/random partitioning, one file per worker.
* :mod:`.comm` — process group, bounded point-to-point transfers, errors.
* :mod:`.sar` — :class:`SARGraph` and the sequential-aggregation autograd op.
* :mod:`.convs` — SAR-aware GENConv, GATConv, SAGEConv, GINConv.
* :mod:`.run` — the distributed training loop (``torchrun``).

Heavy imports (torch_geometric) are deferred to the submodules.
"""
from .comm import SARCommError, init_distributed
from .partition import (PartitionMismatchError, build_partitions,
                        load_partition, partition_nodes, save_partitions)

__all__ = ['SARCommError', 'PartitionMismatchError', 'init_distributed',
           'build_partitions', 'load_partition', 'partition_nodes',
           'save_partitions']
