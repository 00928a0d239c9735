"""The one conv registry: options from signatures, models and SAR driven by it, clear errors."""

import pytest
import torch
from conftest import rel_err
from torch_geometric.nn import GraphConv
from torch_geometric.nn import Linear as PygLinear

from revgnn.distributed.aggregate_sar import sar_aggregate
from revgnn.distributed.convs import convert_to_sar, sar_forms, sar_unsupported
from revgnn.distributed.partition import build_partitions
from revgnn.distributed.sar import SARGraph
from revgnn.models import RevGNN
from revgnn.models.components import encode_edges
from revgnn.nn import (
    CONVS,
    GroupAddRev,
    LinearEdgeFeatures,
    PreActBlock,
    Shared,
    SharedDropout,
    conv_spec,
    list_convs,
    make_block,
    register_conv,
)

N, E, C, F_EDGE = 30, 120, 4, 3


@pytest.fixture
def graph():
    g = torch.Generator().manual_seed(0)
    ei = torch.randint(0, N, (2, E), generator=g)
    return (
        ei,
        torch.randn(N, C, generator=g, dtype=torch.float64),
        torch.randn(E, F_EDGE, generator=g).double(),
    )


@pytest.fixture
def user_conv():
    """A conv type a user adds: one decorated class (GraphConv has no SAR version)."""

    @register_conv("graph_test")
    class GraphBlock(PreActBlock):
        def __init__(self, channels, aggr="add", norm="layer", preact=True):
            super().__init__(channels, norm, preact)
            self.conv = GraphConv(channels, channels, aggr=aggr)

        def conv_forward(self, h, edge_index, edge_attr):
            return self.conv(h, edge_index)

    yield GraphBlock
    CONVS.unregister("graph_test")


def test_options_are_read_off_the_constructor():
    assert list_convs() == ["gat", "gcn", "gen", "gin", "sage"]
    assert conv_spec("gen").options == ("aggr", "learn_t", "t", "mlp_layers", "mlp_norm")
    assert conv_spec("gat").defaults == {"heads": 1, "attn_dropout": 0.0}
    assert conv_spec("gcn").options == ()
    assert [c for c in list_convs() if conv_spec(c).uses_edges] == ["gat", "gen"]
    assert [c for c in list_convs() if conv_spec(c).factored_edges] == ["gat", "gen"]
    assert make_block("sage", 8, aggr="max").conv.aggr == "max"
    with pytest.raises(ValueError, match=r"conv='sage' has no option\(s\) heads; it accepts aggr"):
        make_block("sage", 8, heads=2)
    with pytest.raises(ValueError, match=r"unknown conv 'sag' \(did you mean 'sage'"):
        make_block("sag", 8)


def test_models_take_every_registered_option_and_reject_others(graph, user_conv):
    ei, x, ea = graph
    model = RevGNN(C, 8, 2, num_layers=2, conv="graph_test", aggr="mean", edge_channels=F_EDGE)
    assert type(model.layers[0].convs[0]) is user_conv and model.layers[0].convs[0].conv.aggr == "mean"
    assert model.edge_encoder is None  # the conv uses no edge features
    model(x.float(), ei, ea.float()).square().sum().backward()  # (PyG's sparse mean: float32 only)
    with pytest.raises(ValueError, match=r"conv='gcn' has no option\(s\) heads"):
        RevGNN(C, 8, 2, num_layers=2, conv="gcn", heads=2)
    with pytest.raises(ValueError, match=r"conv='graph_test' has no option\(s\) learn_t"):
        RevGNN(C, 8, 2, num_layers=2, conv="graph_test", learn_t=True)
    with pytest.raises(ValueError, match=r"aggr must be one of 'mean', 'max', 'add', 'sum', got 'lstn'"):
        RevGNN(C, 8, 2, num_layers=2, conv="sage", aggr="lstn")


def test_a_conv_s_own_options_are_set_through_the_model():
    """Options the model does not know (GENBlock's t, mlp_layers) reach every block, by name."""
    from revgnn.models import ResGNN

    for cls in (RevGNN, ResGNN):
        model = cls(C, 8, 2, num_layers=2, conv="gen", aggr="softmax", t=0.5, mlp_layers=1)
        block = model.layers[0].convs[0] if cls is RevGNN else model.layers[0]
        linears = [m for m in block.conv.mlp if isinstance(m, PygLinear)]
        assert block.conv.aggr_module.t == 0.5 and len(linears) == 1, cls
    assert RevGNN(C, 8, 2, num_layers=1, conv="gat", heads=2).layers[0].convs[0].conv.heads == 2


def test_edge_embedding_factored_only_for_convs_registered_so(graph):
    _, _, ea = graph
    enc = torch.nn.Linear(F_EDGE, 8).double()
    assert isinstance(encode_edges(enc, ea, "gen"), LinearEdgeFeatures)
    assert isinstance(encode_edges(enc, ea, "gat"), LinearEdgeFeatures)  # GAT's fused op keeps it so

    @register_conv("edge_sum")
    class EdgeSum(PreActBlock):  # reads its edge features whole: the model evaluates them once
        def __init__(self, channels, edge_channels=None, norm="layer", preact=True):
            super().__init__(channels, norm, preact)

        def conv_forward(self, h, edge_index, edge_attr):
            return h

    try:
        assert torch.equal(encode_edges(enc, ea, "edge_sum").value, enc(ea))
    finally:
        CONVS.unregister("edge_sum")


@pytest.mark.parametrize("name", list_convs())
def test_every_registered_conv_is_exact_in_a_reversible_stack(name, graph):
    """Three GroupAddRev blocks of the conv (2 groups, dropout mask) vs the same blocks in plain
    autograd, float64: output and the gradients of input, edge features and every parameter."""
    ei, x, ea = graph
    spec = conv_spec(name)
    runs = []
    for disable in (False, True):
        torch.manual_seed(0)
        kwargs = {"edge_channels": F_EDGE} if spec.uses_edges else {}
        blocks = torch.nn.ModuleList(
            GroupAddRev(make_block(name, C // 2, **kwargs), num_groups=2, disable=disable) for _ in range(3)
        ).double()
        xs, e = x.clone().requires_grad_(), ea.clone().requires_grad_()
        mask = SharedDropout(0.3)(xs)
        h = xs
        for block in blocks:
            h = block(h, ei, Shared(e if spec.uses_edges else None), mask)
        (h.sin() * h).sum().backward()
        runs.append(
            [h.detach(), xs.grad]
            + ([e.grad] if spec.uses_edges else [])
            + [p.grad for p in blocks.parameters()]
        )
    floor = 1e-6 * max(g.abs().max() for g in runs[1][1:])  # GAT's att_dst gradient is exactly 0
    for a, b in zip(*runs):
        assert ((a - b).abs().max() / b.abs().max().clamp_min(floor)) <= 1e-10


def _sar_check(name, graph):
    """Output and every gradient of the block on a one-worker SARGraph vs the full graph."""
    ei, x, ea = graph
    spec = conv_spec(name)
    kwargs = {"edge_channels": F_EDGE} if spec.uses_edges else {}
    torch.manual_seed(0)
    ref = make_block(name, C, **kwargs).double()
    sar = make_block(name, C, **kwargs).double()
    sar.load_state_dict(ref.state_dict())
    convert_to_sar(sar)
    sar_graph = SARGraph(build_partitions(ei, N, 1, edge_attr=ea)[0])
    nid, eid = sar_graph.node_ids, sar_graph.edge_ids
    w = torch.randn(N, C, dtype=torch.float64)
    runs = []
    for block, xs, edges, e in ((ref, x, ei, ea), (sar, x[nid], sar_graph, ea[eid])):
        xs, e = xs.clone().requires_grad_(), e.clone().requires_grad_()
        out = block(xs, edges, e if spec.uses_edges else None)
        (out * (w if block is ref else w[nid])).sum().backward()
        runs.append([out.detach(), xs.grad] + ([e.grad] if spec.uses_edges else []))
        runs[-1] += [p.grad for p in block.parameters()]
    (out_ref, gx_ref, *rest_ref), (out, gx, *rest) = runs
    assert rel_err(out, out_ref[nid]) <= 1e-12 and rel_err(gx, gx_ref[nid]) <= 1e-12
    if spec.uses_edges:
        assert rel_err(rest[0], rest_ref[0][eid]) <= 1e-12
        rest, rest_ref = rest[1:], rest_ref[1:]
    floor = 1e-6 * max(g.abs().max() for g in rest_ref)  # GAT's att_dst gradient is exactly 0
    for g, g_ref in zip(rest, rest_ref):
        assert ((g - g_ref).abs().max() / g_ref.abs().max().clamp_min(floor)) <= 1e-12


@pytest.mark.parametrize("name", list_convs())
def test_every_registered_conv_runs_under_sar_or_says_what_to_use(name, graph):
    if not sar_unsupported(name):
        _sar_check(name, graph)
        return
    with pytest.raises(NotImplementedError, match=f"conv {name!r} .*Under SAR use one of the convs"):
        convert_to_sar(make_block(name, C))


def test_a_conv_without_sar_version_is_named_with_the_alternatives(user_conv, graph):
    assert (
        sar_unsupported("graph_test")
        == "conv 'graph_test' is built on GraphConv, which has no SAR implementation"
    )
    model = RevGNN(C, 8, 2, num_layers=2, conv="graph_test")
    with pytest.raises(NotImplementedError) as err:
        convert_to_sar(model)
    msg = str(err.value)
    assert "conv 'graph_test' is built on GraphConv" in msg and "unsupported under SAR" in msg
    assert "gat, gcn, gen, gin, sage" in msg and "backend=local" in msg
    assert not any(type(m) in sar_forms().values() for m in model.modules())  # nothing half-converted


class SARGraphConv(GraphConv):
    r"""The SAR form of PyG's GraphConv (sum aggregation) a user writes beside their block:
    :math:`\Theta_1\sum_j \mathbf{x}_j + \Theta_2\mathbf{x}_i`, the sum through the fused shard
    operators."""

    def forward(self, x, edge_index, edge_weight=None, size=None):
        if not isinstance(edge_index, SARGraph):
            return super().forward(x, edge_index, edge_weight, size)
        return self.lin_rel(sar_aggregate(edge_index, x, "sum")) + self.lin_root(x)


@pytest.fixture
def user_conv_with_sar():
    """A conv with SAR support a user adds, in one file: the block, registered naming its SAR form."""

    @register_conv("graph_sar_test", sar=SARGraphConv)
    class GraphSARBlock(PreActBlock):
        def __init__(self, channels, norm="layer", preact=True):
            super().__init__(channels, norm, preact)
            self.conv = GraphConv(channels, channels)

        def conv_forward(self, h, edge_index, edge_attr):
            return self.conv(h, edge_index)

    yield GraphSARBlock
    CONVS.unregister("graph_sar_test")


def test_a_conv_added_in_one_file_serves_every_model_and_sar(user_conv_with_sar, graph):
    """docs/layout.md's "what an addition touches", measured: this file alone adds a conv that
    RevGNN, GraphRevGNN, DEQGNN and SAR take by name."""
    from revgnn.models import DEQGNN, GraphRevGNN

    ei, x, ea = graph
    assert sar_unsupported("graph_sar_test") == ""
    assert sar_forms()[GraphConv] is SARGraphConv
    _sar_check("graph_sar_test", graph)  # output and every gradient on a SARGraph, to 1e-12
    models = [
        RevGNN(C, 8, 2, num_layers=2, conv="graph_sar_test"),
        GraphRevGNN(C, 8, 2, num_layers=2, conv="graph_sar_test", encoder="linear"),
        DEQGNN(C, 8, 2, conv="graph_sar_test", max_iter=10),
    ]
    blocks = [models[0].layers[0].convs[0], models[1].layers[0].convs[0], models[2].layer.convs[0]]
    assert all(type(b) is user_conv_with_sar for b in blocks)
    for model in models:
        model(x.float(), ei).square().sum().backward()  # (PyG sparse-matmul path: float32 only)
    convert_to_sar(models[0])
    assert type(models[0].layers[0].convs[0].conv) is SARGraphConv


def test_a_sar_form_must_subclass_one_pyg_conv():
    with pytest.raises(TypeError, match="takes a class or 'module:Class'"):
        register_conv("bad_sar_test", sar="SARGraphConv")(type("B", (PreActBlock,), {}))
    register_conv("bad_sar_test", sar=torch.nn.Linear)(type("B", (PreActBlock,), {}))
    try:
        with pytest.raises(TypeError, match="conv 'bad_sar_test': its SAR form .*Linear.* must subclass"):
            sar_forms()
    finally:
        CONVS.unregister("bad_sar_test")


@pytest.mark.parametrize(
    "init,match",
    [
        ("def __init__(self, channels, *args, norm=None, preact=True): pass", r"\*args or \*\*kwargs"),
        ("def __init__(self, size, norm=None, preact=True): pass", "`channels` as its first"),
        ("def __init__(self, channels, norm=None): pass", "must accept preact"),
        ("def __init__(self, channels, k, norm=None, preact=True): pass", "needs a default for k"),
    ],
)
def test_registration_errors(init, match):
    namespace = {}
    exec(f"class Bad(torch.nn.Module):\n    {init}", {"torch": torch}, namespace)
    with pytest.raises(TypeError, match=match):
        register_conv("bad_test")(namespace["Bad"])
    assert "bad_test" not in CONVS
    with pytest.raises(ValueError, match="'gen' is already registered.*GENBlock"):
        register_conv("gen")(type("Other", (PreActBlock,), {}))
