"""DEQ-GNN: parameter counts, the paper map, fixed dropout mask, contraction, pretraining schedule."""

import pytest
import torch

from revgnn.deq import SOLVERS, get_solver
from revgnn.models import count_parameters, create_model, model_info
from revgnn.models.deq_gnn import DEQGNN, DEQGNNLayer, deq_gnn  # noqa: F401  (registers deq_gnn)


def graph(n=40, p=0.15, seed=0, dtype=torch.float32, channels=16):
    g = torch.Generator().manual_seed(seed)
    adj = torch.rand(n, n, generator=g) < p
    edge_index = adj.nonzero().T.contiguous()
    x = torch.randn(n, channels, generator=g, dtype=dtype)
    edge_attr = torch.rand(edge_index.size(1), 8, generator=g, dtype=dtype)
    return x, edge_index, edge_attr


INFO = model_info("deq_gnn")
#: width -> (the registry's exact count, the count the paper states) of each published DEQ-GNN
PAPER_SIZES = {
    r.overrides.get("hidden_channels", INFO.defaults["hidden_channels"]): (
        r.num_parameters or INFO.num_parameters,
        r.paper_parameters,
    )
    for r in INFO.reported
}


@pytest.mark.parametrize("hidden,expected", [(h, count) for h, (count, _) in PAPER_SIZES.items()])
def test_parameter_counts_match_paper(hidden, expected):
    """The registry's exact count, and the paper's (``"51.3K"``, ``"537K"``: truncated, not rounded)."""
    got = count_parameters(create_model("deq_gnn", hidden_channels=hidden))
    assert got == expected
    stated = PAPER_SIZES[hidden][1]
    digits = stated.removesuffix("K")
    step = 10 ** -len(digits.partition(".")[2])
    assert float(digits) <= got / 1000 < float(digits) + step, (got, stated)


def test_forward_backward_and_stats():
    torch.manual_seed(0)
    x, ei, ea = graph()
    model = create_model("deq_gnn", hidden_channels=16, max_iter=100)
    out = model(x, ei, ea)
    assert out.shape == (40, 112)
    out.square().mean().backward()
    stats = model.deq_stats()
    assert stats["forward_converged"] == 1.0 and stats["backward_steps"] >= 1
    assert all(p.grad is not None for p in model.parameters())
    assert "DEQGNNLayer" in repr(model)
    model.reset_parameters()
    with pytest.raises(TypeError):
        create_model("deq_gnn", solver_options={"history": 3})


def _paper_map(layer, z, x, ei, ea, mask):
    """The paper's map written out with PyG's GENConv path (``conv(...)``), not the fused kernels."""
    c1, c2 = (block.conv for block in layer.convs)  # the GENConvs of the GEN blocks
    n1, n2 = layer.norms
    if ea is None:
        e1 = e2 = None
    else:  # the shared encoder then each conv's own encoder, applied as one composed map
        emb = layer.edge_encoder(ea)
        e1, e2 = (block.edge_encoder(emb) for block in layer.convs)
    z1 = c1(z, ei, e1)
    return n2((c2(mask * n1(z1 + x).relu(), ei, e2) + z1).relu())


@pytest.mark.parametrize("edges", [False, True])
def test_paper_map(edges):
    """The layer (fused kernels where they apply) computes the paper's map: in float64 to rounding
    (1e-12); in float32 it is as close to the float64 map as PyG's own float32 path is, within a
    small factor (both round differently: FMA, vector width and summation order vary with the CPU)."""
    torch.manual_seed(0)
    layer = DEQGNNLayer(16, edge_channels=8 if edges else None).double()
    x, ei, ea = graph(dtype=torch.float64)
    ea = ea if edges else None
    z = torch.randn(40, 16, dtype=torch.float64)
    mask = (torch.rand(40, 16) > 0.5).double() * 2
    expected = _paper_map(layer, z, x, ei, ea, mask)
    assert (layer(z, x, ei, ea, mask) - expected).abs().max() <= 1e-12 * expected.abs().max()

    layer32 = layer.float()
    z32, x32, mask32 = z.float(), x.float(), mask.float()
    ea32 = ea.float() if edges else None
    ours = (layer32(z32, x32, ei, ea32, mask32) - expected).abs().max()
    pyg = (_paper_map(layer32, z32, x32, ei, ea32, mask32) - expected).abs().max()
    bound = 2 * pyg + 64 * torch.finfo(torch.float32).eps * expected.abs().max()
    assert ours <= bound, (ours, pyg)


def test_three_solvers_agree_on_the_layer():
    torch.manual_seed(0)
    x, ei, _ = graph(dtype=torch.float64)
    layer = DEQGNNLayer(16).double()
    # The untrained paper map is not a contraction here: plain iteration oscillates (rel. residual
    # 0.28 after 300 steps) while damping 0.5 converges; Anderson and Broyden need no damping.
    options = {"fixed_point": {"damping": 0.5}}
    results = {
        s: get_solver(s)(
            lambda z: layer(z, x, ei), torch.zeros_like(x), tol=1e-10, max_iter=400, **options.get(s, {})
        )
        for s in SOLVERS
    }
    for name, r in results.items():
        assert r.converged, (name, r)
        fz = layer(r.z, x, ei)  # independent residual check
        assert ((fz - r.z).norm() / fz.norm()).item() <= 1e-10
    ref = results["anderson"].z
    for name, r in results.items():
        assert (r.z - ref).abs().max().item() < 1e-7, name


def test_dropout_mask_is_fixed_across_iterations():
    torch.manual_seed(0)
    x, ei, ea = graph()
    model = DEQGNN(16, 16, 3, edge_channels=8, dropout=0.2, max_iter=200, tol=1e-5)
    model.train()
    torch.manual_seed(1)  # the mask is the first random draw of a forward pass
    with torch.no_grad():
        model(x, ei, ea)
    # with a fresh mask per iteration the residual would stay O(1)
    assert model.deq_stats()["forward_converged"] == 1.0
    # and the equilibrium is one of the map with that single mask
    h = model.node_encoder(x)
    torch.manual_seed(1)
    mask = model.dropout(h)
    assert mask is not None and (mask == 0).any()
    deq = model.deq
    with torch.no_grad():
        res = deq.solve(h, ei, ea, mask)
        fz = deq.f(res.z, h, ei, ea, mask)
    assert ((fz - res.z).norm() / fz.norm()).item() <= 1e-5


@pytest.mark.parametrize("aggr,p", [("max", 0.0), ("mean", 0.3)])
def test_contraction_guarantee(aggr, p):
    torch.manual_seed(0)
    x, ei, ea = graph()
    kappa = 0.7
    layer = DEQGNNLayer(16, edge_channels=8, aggr=aggr, dropout=p, contraction=kappa)
    with torch.no_grad():  # weights far outside the ball: the projection must bring them back
        for w in layer.mlp_weights():
            w.mul_(50.0)
    layer.project_()
    mask = (torch.rand(40, 16) > p).float() / (1 - p) if p else None
    ratios = []
    for _ in range(20):
        z1, z2 = 3 * torch.randn(40, 16), 3 * torch.randn(40, 16)
        f1, f2 = layer(z1, x, ei, ea, mask), layer(z2, x, ei, ea, mask)
        ratios.append(((f1 - f2).abs().max() / (z1 - z2).abs().max()).item())
    assert max(ratios) <= kappa
    # unique fixed point: plain iteration from two different starts agrees
    f = lambda z: layer(z, x, ei, ea, mask)  # noqa: E731
    a = get_solver("fixed_point")(f, torch.zeros(40, 16), tol=1e-6, max_iter=200)
    b = get_solver("fixed_point")(f, 10 * torch.randn(40, 16), tol=1e-6, max_iter=200)
    assert a.converged and b.converged
    assert (a.z - b.z).abs().max().item() < 1e-4
    with pytest.raises(ValueError, match="aggr"):
        DEQGNNLayer(16, aggr="softmax", contraction=0.9)


def test_model_implicit_gradient_matches_finite_difference_float64():
    torch.manual_seed(0)
    x, ei, ea = graph(n=25, dtype=torch.float64)
    model = DEQGNN(16, 8, 2, edge_channels=8, contraction=0.5, max_iter=200, tol=1e-12).double()
    model.eval()  # deterministic head; gradients still flow
    with torch.no_grad():  # move inside the norm ball so the projection is inactive under perturbation
        for w in model.layer.mlp_weights():
            w.mul_(0.5)
    params = [p for p in model.parameters()]
    out = model(x, ei, ea)
    out.sum().backward()
    grad = torch.cat([p.grad.flatten() for p in params])
    g = torch.Generator().manual_seed(1)
    for _ in range(2):
        v = [torch.randn(p.shape, generator=g, dtype=torch.float64) for p in params]
        eps = 1e-6
        with torch.no_grad():
            for p, d in zip(params, v):
                p.add_(eps * d)
            up = model(x, ei, ea).sum()
            for p, d in zip(params, v):
                p.sub_(2 * eps * d)
            down = model(x, ei, ea).sum()
            for p, d in zip(params, v):
                p.add_(eps * d)
        fd = ((up - down) / (2 * eps)).item()
        analytic = (grad @ torch.cat([d.flatten() for d in v])).item()
        assert abs(fd - analytic) <= 1e-6 * abs(fd), (fd, analytic)


def test_pretraining_schedule():
    x, ei, ea = graph()
    model = DEQGNN(16, 16, 3, edge_channels=8, pretrain_epochs=2, pretrain_depth=3)
    assert model.phase == "pretrain" and model.deq.backward == "unroll"
    model.set_epoch(1)
    assert model.phase == "pretrain"
    model(x, ei, ea).sum().backward()
    assert model.deq_stats()["forward_steps"] == 3
    model.set_epoch(2)
    assert model.phase == "equilibrium" and model.deq.backward == "implicit"
    model(x, ei, ea).sum().backward()
    assert "backward_steps" in model.deq_stats()
    plain = DEQGNN(16, 16, 3, backward="phantom")
    plain.set_epoch(0)
    assert plain.phase == "equilibrium" and plain.deq.backward == "phantom"


def test_equilibrium_is_solved_in_float32_under_autocast():
    torch.manual_seed(0)
    x, ei, ea = graph()
    model = DEQGNN(16, 16, 3, edge_channels=8, max_iter=100, tol=1e-5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x, ei, ea)
    assert model.deq_stats()["forward_converged"] == 1.0  # bf16 would stall near 1e-2
    out.float().sum().backward()
    assert model.deq_stats()["backward_converged"] == 1.0
