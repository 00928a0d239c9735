"""Data: the :class:`NodeDataset` format, OGB loaders, one's own graphs (a saved PyG ``Data``, a
``torch_geometric.datasets`` class: :mod:`revgnn.data.pyg_data`), the generated ``proteins_like``
graph and vectorised random-partition sub-graph sampling.

Names are imported on first use: the config schemas read the loaders' signatures
(:func:`revgnn.config.data_options.data_schema`) without importing torch.
"""

from revgnn.utils.lazy import lazy_exports

_HOME = {
    "NodeDataset": "node_dataset",
    "GraphDataset": "graph_dataset",
    "load_ogbn": "ogbn",
    "OGBN_DATASETS": "ogbn",
    "load_ogbg": "graph_dataset",
    "OGBG_DATASETS": "graph_dataset",
    "proteins_like": "synthetic",
    "mol_like": "graph_dataset",
    "Partition": "random_parts",
    "SubGraph": "random_parts",
    "partition_graph": "random_parts",
    "random_partition": "random_parts",
    "OGBN_SPECS": "ogbn",
    "OgbnSpec": "ogbn",
    "node_order": "ordering",
    "reorder": "ordering",
    "load_pyg_file": "pyg_data",
    "load_pyg_dataset": "pyg_data",
    "from_pyg": "pyg_data",
}
__all__ = list(_HOME)
__getattr__ = lazy_exports(__name__, _HOME)
