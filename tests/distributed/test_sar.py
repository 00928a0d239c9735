"""SAR exactness: distributed (gloo, spawned workers on 127.0.0.1) vs the
single-process PyG model on the full graph, float64, elementwise.

One spawn per world size runs every check, since starting workers (importing
torch + PyG) dominates the cost on small machines.
"""

from __future__ import annotations

import pytest
import torch
from conftest import rel_err
from sar_cases import F_EDGE, F_IN, N, check, compare_model, make_graph, make_parts

from revgnn.distributed.partition import build_partitions
from revgnn.testing.workers import run_workers


def _conv_models():
    """(name, constructor, uses_edge_attr) for every aggregation kind."""
    from torch.nn import BatchNorm1d, Linear, ReLU, Sequential
    from torch_geometric.nn import GATConv, GCNConv, GENConv, GINConv, SAGEConv

    return [
        (
            "sum/GIN",
            lambda: GINConv(Sequential(Linear(F_IN, 16), ReLU(), Linear(16, 8)), train_eps=True),
            False,
        ),
        # no bias before BatchNorm: its exact gradient is 0, so only
        # rounding noise would be compared
        (
            "sum/GIN-batchnorm",
            lambda: GINConv(Sequential(Linear(F_IN, 16, bias=False), BatchNorm1d(16), ReLU(), Linear(16, 8))),
            False,
        ),
        ("softmax/GEN-batchnorm", lambda: GENConv(F_IN, F_IN, aggr="softmax", norm="batch"), False),
        ("sum/GCN", lambda: GCNConv(F_IN, 8), False),
        ("mean/SAGE", lambda: SAGEConv(F_IN, 8, aggr="mean"), False),
        ("max/SAGE", lambda: SAGEConv(F_IN, 8, aggr="max"), False),
        ("max/ties", TieMax, False),
        ("max/GEN", lambda: GENConv(F_IN, 8, aggr="max", edge_dim=F_EDGE, norm="layer", bias=True), True),
        (
            "softmax/GEN",
            lambda: GENConv(
                F_IN, 8, aggr="softmax", learn_t=True, t=0.7, edge_dim=F_EDGE, norm="layer", bias=True
            ),
            True,
        ),
        ("softmax/GEN-nolearn", lambda: GENConv(F_IN, F_IN, aggr="softmax", t=1.3, norm="layer"), False),
        (
            "softmax_sg/GEN-msgnorm",
            lambda: GENConv(
                F_IN, 8, aggr="softmax_sg", t=0.5, msg_norm=True, learn_msg_scale=True, norm="layer"
            ),
            False,
        ),
        ("GAT", lambda: GATConv(F_IN, 5, heads=3, edge_dim=F_EDGE), True),
        ("GAT-mean-heads", lambda: GATConv(F_IN, 4, heads=2, concat=False, add_self_loops=False), False),
    ]


class TieMax(torch.nn.Module):
    """SAGE max over integer-valued features (straight-through floor): many
    exact ties, many of them at 0, where torch's amax backward also counts
    the zero initial value."""

    def __init__(self):
        super().__init__()
        from torch_geometric.nn import SAGEConv

        self.conv = SAGEConv(F_IN, 8, aggr="max")

    def forward(self, x, edge_index):
        return self.conv(torch.floor(2 * x) + (x - x.detach()), edge_index)


def _call_conv(model, x, edge_index, edge_attr):
    if edge_attr is None:
        return model(x, edge_index)
    return model(x, edge_index, edge_attr)


class RevStack(torch.nn.Module):
    """A reversible GENConv stack built from the core's public blocks:
    Linear encoders -> L x GroupAddRev(GENBlock, 2 groups) -> LayerNorm ->
    Linear. (The zoo's RevGNN is exercised by the runner test.)"""

    def __init__(
        self, num_layers, aggr="max", learn_t=False, weight_tied=False, hidden=8, conv="gen", **block_kwargs
    ):
        super().__init__()
        from revgnn.nn import GENBlock, GroupAddRev, WeightTied, make_block

        self.enc = torch.nn.Linear(F_IN, hidden)
        self.edge_enc = torch.nn.Linear(F_EDGE, hidden)

        def block():
            if conv == "gen":
                inner = GENBlock(hidden // 2, edge_channels=hidden, aggr=aggr, learn_t=learn_t)
            else:
                inner = make_block(conv, hidden // 2, **block_kwargs)
            return GroupAddRev(inner, num_groups=2)

        self.weight_tied = weight_tied
        if weight_tied:
            self.layers = WeightTied(block(), num_layers)
        else:
            self.layers = torch.nn.ModuleList([block() for _ in range(num_layers)])
        self.norm = torch.nn.LayerNorm(hidden)
        self.head = torch.nn.Linear(hidden, 3)

    def forward(self, x, edge_index, edge_attr=None):
        from revgnn.nn import Shared

        h = self.enc(x)
        e = Shared(None if edge_attr is None else self.edge_enc(edge_attr))
        if self.weight_tied:
            h = self.layers(h, edge_index, e)
        else:
            for layer in self.layers:
                h = layer(h, edge_index, e)
        return self.head(self.norm(h).relu())


def _rev_model():
    return RevStack(20, aggr="max")


def _rev_model_softmax():
    return RevStack(6, aggr="softmax", learn_t=True)


def _wt_rev_model():
    return RevStack(5, aggr="max", weight_tied=True)


def _block_stacks():
    """Reversible stacks of the core's other blocks (3 layers each)."""
    return [
        ("RevStack-GAT", lambda: RevStack(3, conv="gat", heads=2, edge_channels=8), True),
        ("RevStack-GCN-batchnorm", lambda: RevStack(3, conv="gcn", norm="batch"), False),
        ("RevStack-SAGE", lambda: RevStack(3, conv="sage"), False),
        ("RevStack-GIN", lambda: RevStack(3, conv="gin"), False),
    ]


def _check_train_step(graph):
    """The loop's ``train_step`` on a :class:`SARTask` (global loss normalisation + gradient
    all-reduce) makes the same SGD update as one process on the full graph, with per-tensor and
    with flat parameters (one all-reduced flat gradient)."""
    import torch.distributed as dist

    from revgnn.distributed.comm import broadcast_parameters
    from revgnn.distributed.convs import convert_to_sar
    from revgnn.engine.backends import DDPBackend, LocalBackend
    from revgnn.engine.loop import train_step
    from revgnn.engine.run import Run
    from revgnn.engine.sar_backend import SARTask
    from revgnn.utils.optimizer import ModelOptimizer

    ei, x, ea = make_graph()
    y = (torch.randn(N, 3, generator=torch.Generator().manual_seed(3)) > 0).double()
    train = torch.arange(N) % 3 != 0
    torch.manual_seed(99)
    ref = _rev_model_softmax()
    before = [p.detach().clone() for p in ref.parameters()]
    ref_state = {k: v.clone() for k, v in ref.state_dict().items()}
    opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    loss_ref = torch.nn.functional.binary_cross_entropy_with_logits(ref(x, ei, ea)[train], y[train])
    loss_ref.backward()
    opt.step()
    backend = DDPBackend(None) if dist.is_initialized() else LocalBackend(None)
    nid = graph.node_ids
    graph.node_data = {"x": x[nid], "y": y[nid], "train_mask": train[nid]}
    meta = {"dataset": {"name": "test", "task": "multilabel", "evaluator": "ogbn-proteins", "num_classes": 3}}
    task = SARTask(graph, meta, backend, "cpu")
    task.edge_attr = ea[graph.edge_ids]
    errs = []
    for flat in (False, True):
        sar = _rev_model_softmax()
        sar.load_state_dict(ref_state)
        convert_to_sar(sar)
        if dist.is_initialized():
            broadcast_parameters(sar)
        optimizer = ModelOptimizer(sar, lambda ps: torch.optim.SGD(ps, lr=0.5), flat)
        (step,) = task.train_steps(None, "cpu")
        loss, stop = train_step(Run(sar, task, optimizer, backend), step)
        name = "train_step flat" if flat else "train_step"
        errs.append((name, "loss", abs(loss - loss_ref.item()) / abs(loss_ref.item())))
        for (n, p_ref), p, b in zip(ref.named_parameters(), sar.parameters(), before):
            errs.append((name, f"update {n}", rel_err(p - b, p_ref - b)))
    return errs


def _worker_exactness(rank, world_size, kind, with_models):
    torch.set_default_dtype(torch.float64)
    from revgnn.distributed.sar import SARGraph

    ei, x, ea = make_graph()
    parts = build_partitions(
        ei, N, world_size, parts=make_parts(world_size, kind), edge_attr=ea, node_data={"x": x}
    )
    graph = SARGraph(parts[rank], timeout_s=60)
    assert torch.equal(graph.edge_attr, ea[graph.edge_ids])
    errs = []
    for name, build, uses_edges in _conv_models():
        errs += compare_model(name, build, uses_edges, graph, parts[rank], _call_conv, _call_conv)
    if with_models:
        errs += compare_model(
            "RevStack-20-GEN-max", _rev_model, True, graph, parts[rank], _call_conv, _call_conv
        )
        errs += compare_model(
            "RevStack-6-GEN-softmax", _rev_model_softmax, True, graph, parts[rank], _call_conv, _call_conv
        )
        errs += compare_model(
            "WT-RevStack-5-GEN-max", _wt_rev_model, True, graph, parts[rank], _call_conv, _call_conv
        )
        errs += _check_train_step(graph)
        if world_size == 4:
            for name, build, uses_edges in _block_stacks():
                errs += compare_model(name, build, uses_edges, graph, parts[rank], _call_conv, _call_conv)
    return errs


@pytest.mark.parametrize(
    "world_size,kind,with_models",
    [
        (1, "metis", True),
        (2, "metis", True),
        (3, "unbalanced", False),
        (4, "empty", True),
    ],
)
def test_sar_matches_single_process(world_size, kind, with_models):
    if world_size == 1:  # no process group needed: run in this process
        from types import SimpleNamespace

        dtype = torch.get_default_dtype()
        try:
            errs = _worker_exactness(0, 1, kind, with_models)
        finally:
            torch.set_default_dtype(dtype)
        return check([SimpleNamespace(rank=0, value=errs)])
    results = run_workers(
        _worker_exactness, world_size, kind, with_models, timeout_s=60, wall_s=240, threads=1
    )
    check(results)


def test_no_edge_sized_tensor_is_saved():
    """Forward of SAR GAT / GENConv-softmax saves no edge-sized float tensor
    except the edge-attribute input itself (single worker, no process
    group needed)."""
    from torch_geometric.nn import GATConv, GENConv

    from revgnn.distributed.convs import convert_to_sar
    from revgnn.distributed.sar import SARGraph

    ei, x, ea = make_graph()
    graph = SARGraph(build_partitions(ei, N, 1, edge_attr=ea)[0])
    e_sizes = {graph.num_edges, graph.with_self_loops().num_edges}
    cases = [
        (GATConv(F_IN, 4, heads=3), None),
        (
            GENConv(F_IN, F_IN, aggr="softmax", learn_t=True, edge_dim=F_EDGE, norm="layer"),
            graph.edge_attr.double().requires_grad_(),
        ),
        (
            GENConv(F_IN, F_IN, aggr="max", edge_dim=F_EDGE, norm="layer"),
            graph.edge_attr.double().requires_grad_(),
        ),
    ]
    for conv, edge_attr in cases:
        conv = convert_to_sar(conv.double())
        saved = []

        def pack(t):
            saved.append(t)
            return t

        xl = x[graph.node_ids].clone().requires_grad_()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = conv(xl, graph) if edge_attr is None else conv(xl, graph, edge_attr)
        edge_sized = [
            t
            for t in saved
            if t.is_floating_point()
            and t.dim()
            and t.size(0) in e_sizes
            and not (edge_attr is not None and t.data_ptr() == edge_attr.data_ptr())
        ]
        assert not edge_sized, (conv, [tuple(t.shape) for t in edge_sized])
        out.sum().backward()
        assert xl.grad is not None


def test_sar_graph_rejects_wrong_world_size():
    from revgnn.distributed.part_files import PartitionMismatchError
    from revgnn.distributed.sar import SARGraph

    ei, x, ea = make_graph()
    part = build_partitions(ei, N, 2, method="random")[1]
    with pytest.raises(PartitionMismatchError, match="2-worker|1-worker"):
        SARGraph(part)
