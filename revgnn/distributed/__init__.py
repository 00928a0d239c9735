r"""Distributed full-graph training with SAR (sequential aggregation and
rematerialisation, Mostafa 2021) on :mod:`torch.distributed`.

* :mod:`.sar_partition` — METIS/random partitioning, one checked file per worker
  (``revgnn-partition``).
* :mod:`.comm` — process group, bounded point-to-point transfers, errors.
* :mod:`.sar` — :class:`SARGraph` and the sequential-aggregation autograd op.
* :mod:`.convs` — SAR-aware GENConv, GATConv, SAGEConv, GINConv.

Training runs in the one loop (:mod:`revgnn.engine`, ``backend=sar``); this
package never imports it. Names are resolved lazily, so ``revgnn-partition
--help`` does not import torch.
"""

import importlib

_EXPORTS = {
    "SARCommError": "comm",
    "init_distributed": "comm",
    "PartitionMismatchError": "partition",
    "build_partitions": "partition",
    "load_partition": "partition",
    "load_partition_checked": "partition",
    "load_meta": "partition",
    "partition_dataset": "partition",
    "partition_nodes": "partition",
    "save_partitions": "partition",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
