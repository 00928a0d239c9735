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

from revgnn.utils.lazy import lazy_exports

_EXPORTS = {
    "SARCommError": "comm",
    "init_distributed": "comm",
    "PartitionMismatchError": "sar_partition",
    "build_partitions": "sar_partition",
    "load_partition": "sar_partition",
    "load_partition_checked": "sar_partition",
    "load_meta": "sar_partition",
    "partition_dataset": "sar_partition",
    "partition_nodes": "sar_partition",
    "save_partitions": "sar_partition",
}
__all__ = sorted(_EXPORTS)


__getattr__ = lazy_exports(__name__, _EXPORTS)
