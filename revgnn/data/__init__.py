"""Data: the :class:`NodeDataset` format, OGB loaders, the generated ``proteins_like`` graph and
vectorised random-partition sub-graph sampling."""

from revgnn.data.node_dataset import NodeDataset
from revgnn.data.ogbn import OGBN_DATASETS, load_ogbn
from revgnn.data.random_parts import Partition, SubGraph, partition_graph, random_partition
from revgnn.data.synthetic import proteins_like

__all__ = [
    "NodeDataset",
    "load_ogbn",
    "OGBN_DATASETS",
    "proteins_like",
    "Partition",
    "SubGraph",
    "partition_graph",
    "random_partition",
]
