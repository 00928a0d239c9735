r"""Distributed full-graph training with SAR (sequential aggregation and
rematerialisation, Mostafa 2021) on :mod:`torch.distributed`.

* :mod:`.partition` — METIS/random partitioning into contiguous parts and
  their shards (run on a data set by ``revgnn-partition``, :mod:`revgnn.cli.partition`).
* :mod:`.part_files` — the part files: one per worker plus ``meta.json``,
  written, read and checked (hashes, fingerprints, the collective check).
* :mod:`.comm` — process group, bounded point-to-point transfers, errors.
* :mod:`.sar` — :class:`SARGraph` and the sequential-aggregation autograd op.
* :mod:`.convs` — SAR-aware GENConv, GATConv, SAGEConv, GINConv, GCNConv: the SAR forms the
  built-in convs name at registration.

Training runs in the one loop (:mod:`revgnn.engine`, ``backend=sar``); this
package never imports it. Names are resolved lazily, so ``revgnn-partition
--help`` does not import torch.
"""

from revgnn.utils.lazy import lazy_exports

_EXPORTS = {
    "SARCommError": "comm",
    "init_distributed": "comm",
    "PartitionMismatchError": "part_files",
    "build_partitions": "partition",
    "load_partition": "part_files",
    "load_partition_checked": "part_files",
    "load_meta": "part_files",
    "partition_dataset": "partition",
    "partition_nodes": "partition",
    "save_partitions": "part_files",
}
__all__ = sorted(_EXPORTS)


__getattr__ = lazy_exports(__name__, _EXPORTS)
