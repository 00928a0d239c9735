"""NodeDataset and GraphDataset refuse bad data at load, every problem in one message (issue #31: a
data set with a negative node id trained to completion)."""

import dataclasses

import pytest
import torch
from torch_geometric.data import Data, InMemoryDataset

from revgnn.data.graph_dataset import GraphDataset, mol_like
from revgnn.data.node_dataset import NodeDataset
from revgnn.data.synthetic import proteins_like


@pytest.fixture(scope="module")
def proteins():
    return proteins_like(num_nodes=200, avg_degree=4, num_tasks=3, max_hops=2, window=5)


def fields(ds, **changes):
    return {**{f.name: getattr(ds, f.name) for f in dataclasses.fields(ds)}, **changes}


def with_id(edge_index, row, value):
    bad = edge_index.clone()
    bad[row, 0] = value
    return bad


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda ds: {"edge_index": with_id(ds.edge_index, 0, -1)},
            r"edge_index holds node ids out of range \[0, 200\) \(min -1",
        ),
        (
            lambda ds: {"edge_index": with_id(ds.edge_index, 1, 200)},
            r"edge_index holds node ids out of range \[0, 200\) \(min 0, max 200",
        ),
        (lambda ds: {"edge_index": ds.edge_index.float()}, "integer node ids"),
        (lambda ds: {"edge_attr": ds.edge_attr[1:]}, "edge_attr has"),
        (
            lambda ds: {"split_idx": {**ds.split_idx, "valid": torch.tensor([0, -2])}},
            r"split 'valid' holds node ids out of range \[0, 200\) \(min -2",
        ),
        (
            lambda ds: {"split_idx": {**ds.split_idx, "test": torch.tensor([200])}},
            r"split 'test' holds node ids out of range \[0, 200\) \(min \d+, max 200",
        ),
        (lambda ds: {"y": ds.y[:, :2]}, r"y must be \[N, num_classes\] = \[200, 3\]"),
        (
            lambda ds: {"x": ds.x.index_fill(0, torch.tensor([4]), float("nan"))},
            r"x holds 16 non-finite \(NaN\) value\(s\) of \d+, the first at node 4",
        ),
    ],
)
def test_node_dataset_refuses_bad_data(proteins, change, message):
    with pytest.raises(ValueError, match=message):
        NodeDataset(**fields(proteins, **change(proteins)))


def test_every_problem_is_in_the_one_message(proteins):
    bad = fields(proteins, edge_index=with_id(proteins.edge_index, 0, -1), y=proteins.y[:, :2])
    bad["split_idx"] = {**proteins.split_idx, "train": torch.tensor([299])}
    with pytest.raises(ValueError) as err:
        NodeDataset(**bad)
    text = str(err.value)
    assert text.startswith("proteins_like: the data set is not valid:")
    assert all(
        part in text
        for part in ("min -1", "y must be", "split 'train' holds node ids out of range [0, 200) (min 299")
    )


def test_multiclass_labels_are_checked_against_num_classes(proteins):
    y = torch.randint(0, 4, (200, 1))
    ok = fields(proteins, y=y, task="multiclass", num_classes=4)
    NodeDataset(**ok)
    with pytest.raises(ValueError, match=r"labels outside \[0, 3\)"):
        NodeDataset(**{**ok, "num_classes": 3})
    with pytest.raises(ValueError, match=r"\[N, 1\] integer classes"):
        NodeDataset(**{**ok, "y": y.float()})


class Collated(InMemoryDataset):
    """A list of graphs collated as OGB's PyG data sets store them (one storage, slices)."""

    def __init__(self, graphs):
        super().__init__()
        self.data, self.slices = self.collate(graphs)


def small_graphs(bad_id=None, nan=False):
    g = torch.Generator().manual_seed(0)
    graphs = []
    for i in range(4):
        n = 3 + i
        edge_index = torch.randint(0, n, (2, 2 * n), generator=g)
        x = torch.randn(n, 5, generator=g)
        if i == 2 and bad_id is not None:
            edge_index[0, 1] = bad_id
        if i == 3 and nan:
            x[0, 0] = float("inf")
        graphs.append(Data(x=x, edge_index=edge_index, y=torch.tensor([[float(i % 2), float("nan")]])))
    return graphs


def graph_dataset(graphs, **kw):
    split = {"train": torch.tensor([0, 1]), "valid": torch.tensor([2]), "test": torch.tensor([3])}
    return GraphDataset(
        **{
            "name": "small",
            "graphs": graphs,
            "split_idx": split,
            "task": "multilabel",
            "num_classes": 2,
            "evaluator": "ogbg-molhiv",
            "in_channels": 5,
            "edge_channels": None,
            **kw,
        }
    )


@pytest.mark.parametrize("store", [list, Collated])
def test_graph_dataset_refuses_bad_graphs(store):
    graph_dataset(store(small_graphs()))  # valid, NaN labels included (missing labels)
    for bad_id in (-1, 5):  # graph 2 has 5 nodes: ids are local to each graph
        with pytest.raises(ValueError, match=rf"1 edge\(s\) hold node ids outside .*\(e.g. {bad_id}\)"):
            graph_dataset(store(small_graphs(bad_id=bad_id)))
    with pytest.raises(ValueError, match="x has 1 non-finite"):
        graph_dataset(store(small_graphs(nan=True)))
    with pytest.raises(ValueError, match=r"node features are \[5\] wide, in_channels is 4"):
        graph_dataset(store(small_graphs()), in_channels=4)
    with pytest.raises(ValueError, match=r"labels must be \[1, 3\] per graph, got 2"):
        graph_dataset(store(small_graphs()), num_classes=3)


def test_graph_dataset_split_ids_negative_and_float():
    graphs = small_graphs()
    with pytest.raises(ValueError, match=r"split 'valid' refers to graph -1, outside \[0, 4\)"):
        graph_dataset(
            graphs,
            split_idx={"train": torch.tensor([0]), "valid": torch.tensor([-1]), "test": torch.tensor([3])},
        )
    with pytest.raises(ValueError, match=r"split 'train' must hold integer graph ids"):
        graph_dataset(
            graphs,
            split_idx={"train": torch.tensor([0.0]), "valid": torch.tensor([1]), "test": torch.tensor([3])},
        )


def test_the_generated_sets_are_valid():
    assert mol_like(num_graphs=20, seed=0).num_graphs == 20
