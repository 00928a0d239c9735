"""PyTorch 2 entry points on every zoo model: revgnn's operators (``torch.library``: schema, fake tensors,
autograd, AOT dispatch), ``torch.func.functional_call`` (the gradients of the tensors passed in, through
reversible blocks and DEQ's implicit backward), ``torch.func.grad`` (equal to autograd, or a clear error),
and ``torch.export`` of the eval forward with the kernels on."""

import pytest
import torch
from conftest import require_kernel
from torch.func import functional_call
from torch.utils._python_dispatch import TorchDispatchMode
from torch_geometric import EdgeIndex
from zoo_cases import PATHS, ZOO, gradients_equal, zoo_case

from revgnn.models import model_info
from revgnn.nn import ops

DEQ_MODELS = [name for name in ZOO if name.startswith("deq_")]


def _small_graph(n=20, e=80, seed=0):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n - 3, (2, e), generator=g)  # the last 3 nodes get no edges
    ei = torch.cat([ei, ei[:, :4]], 1)  # and some parallel edges
    ei = EdgeIndex(ei, sparse_size=(n, n)).sort_by("col")[0]
    (ptr, _), _ = ei.get_csc()
    return ei.as_tensor()[0].contiguous(), ptr, ei.size(1)


def test_operators_pass_opcheck(impl):
    """Each operator's schema, fake (meta) implementation, autograd registration and AOT dispatch, on
    both implementations (C++ kernel, PyTorch), in every edge mode."""
    src, ptr, e = _small_graph()
    n, c, d = ptr.numel() - 1, 5, 3
    g = torch.Generator().manual_seed(1)

    def t(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_()

    x, raw, w, b, dense = t(n, c), t(e, d), t(c, d), t(c), t(e, c)
    for args in [
        (x, ptr, src, raw, w, b, 1e-7),
        (x, ptr, src, dense, None, None, 0.0),
        (x, ptr, src, None, None, None, 1e-7),
    ]:
        torch.library.opcheck(ops.gen_max, args)
    mask = (torch.rand(n, c, generator=g, dtype=torch.float64) > 0.3).double()
    torch.library.opcheck(ops.layer_norm_relu, (x, t(c), t(c), 1e-5, mask, 1.0))
    torch.library.opcheck(ops.layer_norm_relu, (x, t(c), t(c), 1e-5, mask > 0, 1.25))
    torch.library.opcheck(ops.layer_norm_relu, (x, t(c), t(c), 1e-5, None, 1.0))
    if impl == "kernel":  # the SAR shard operators have the kernel only
        block = t(7, c).detach()
        shard_src = torch.randint(0, 7, (e,), generator=g)
        torch.library.opcheck(
            ops.gen_max_shard, (block, ptr, shard_src, raw.detach(), w.detach(), b.detach())
        )


def test_gen_max_implementations_agree_with_ties():
    """Both implementations return the same winners and tie flags (integer features: most maxima tie)."""
    require_kernel()
    src, ptr, e = _small_graph()
    n, c, d = ptr.numel() - 1, 6, 3
    g = torch.Generator().manual_seed(2)
    x = torch.randint(-2, 3, (n, c), generator=g).double()
    raw = torch.randint(0, 2, (e, d), generator=g).double()
    w, b = (
        torch.randint(-1, 2, (c, d), generator=g).double(),
        torch.randint(-1, 2, (c,), generator=g).double(),
    )
    ours = ops.gen_max(x, ptr, src, raw, w, b, 1e-7)
    reference = ops._gen_max_torch(x, ptr, src, raw, w, b, 1e-7)
    assert ours[2].any() and not ours[2].all()
    for u, v in zip(ours, reference):
        assert torch.equal(u, v)


@pytest.mark.parametrize("name", ZOO)
def test_functional_call_gives_the_gradients_of_the_tensors_passed_in(name):
    """``functional_call(model, params, ...)`` then ``.backward()``: every passed-in tensor gets exactly
    the gradient the module's own parameter gets (float64; dropout replayed from the same seed),
    reversible blocks and DEQ's implicit backward included."""
    model, args = zoo_case(name)
    params = {k: v.detach().clone().requires_grad_() for k, v in model.named_parameters()}
    torch.manual_seed(1)
    functional_call(model, params, args).square().mean().backward()
    torch.manual_seed(1)
    model(*args).square().mean().backward()
    compared = 0
    for k, p in model.named_parameters():
        if p.grad is None:
            assert params[k].grad is None, k
            continue
        assert params[k].grad is not None, k
        scale = max(p.grad.norm().item(), 1e-30)
        assert (params[k].grad - p.grad).norm().item() <= 1e-10 * scale, k
        compared += 1
    assert compared >= len(params) // 2


@pytest.mark.parametrize("name", PATHS)
def test_torch_func_grad_equals_autograd_or_names_the_limitation(name):
    """Under ``torch.func.grad`` the operators and reversible blocks take their plain form and PyG gets
    a plain edge_index: the gradient equals autograd's (float64). BatchNorm in training mode updates
    its running statistics in place, which torch.func refuses: the model takes torch.func's own remedy
    (``replace_all_batch_norm_modules_``: batch statistics only, the same forward). DEQ's implicit
    backward cannot be seen through: a clear error."""
    model, args = zoo_case(name)
    torch.func.replace_all_batch_norm_modules_(model)
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p):
        torch.manual_seed(1)
        return functional_call(model, p, args).square().mean()

    if name in DEQ_MODELS:
        with pytest.raises(RuntimeError, match="torch.func transforms .* cannot differentiate the implicit"):
            torch.func.grad(loss)(params)
        return
    grads = torch.func.grad(loss)(params)
    torch.manual_seed(1)
    model(*args).square().mean().backward()
    gradients_equal(grads, {k: p.grad for k, p in model.named_parameters() if p.grad is not None})


class _RevgnnOps(TorchDispatchMode):
    """Records which of revgnn's operators run."""

    def __init__(self):
        super().__init__()
        self.names = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "revgnn":
            self.names.add(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", [n for n in PATHS if n not in DEQ_MODELS])
def test_export_of_the_eval_forward_runs_the_kernels(name):
    """``torch.export`` of the eval forward with the C++ kernels on: the exported program calls the
    operators the eager forward calls and gives the eager result (float64; the edges are sorted inside
    the exported graph and PyG sums over a plain edge_index there, so rounding may differ)."""
    require_kernel()
    model, args = zoo_case(name)
    model.eval()
    with torch.no_grad(), _RevgnnOps() as eager:
        expected = model(*args)
    program = torch.export.export(model, args)
    got = program.module()(*args)
    assert (got - expected).abs().max() <= 1e-12 * expected.abs().max()
    code = program.graph_module.print_readable(print_output=False)
    assert all(f"torch.ops.{op}" in code for op in eager.names), (eager.names, name)
    if model_info(name).defaults.get("aggr") == "max":
        assert "revgnn.gen_max.default" in eager.names  # the GEN max models run the fused operator


def test_export_of_a_deq_is_a_clear_error():
    """A DEQ's solver loop runs until a data-dependent residual test passes: no exported graph holds it."""
    model, args = zoo_case("deq_gnn_small", dtype=torch.float32)
    with pytest.raises(RuntimeError, match="torch.export cannot capture a DEQ: its solver iterates"):
        torch.export.export(model.eval(), args)


@pytest.mark.parametrize("name", ZOO)
def test_sparse_adjacency_equals_the_edge_index(name):
    """A ``torch.sparse`` CSR or COO ``adj_t`` (PyG's convention: ``adj_t[i, j]`` is an edge ``j -> i``),
    with the edge features in its stored order, gives the ``edge_index`` result (float64; the order of
    summation may differ)."""
    model, (x, ei, ea, *rest) = zoo_case(name)
    n, e = x.size(0), ei.size(1)
    torch.manual_seed(1)
    expected = model(x, ei, ea, *rest)
    perm = (ei[1] * n + ei[0]).argsort()  # destination-major: CSR's order
    dst, src = ei[1, perm], ei[0, perm]
    crow = torch.zeros(n + 1, dtype=torch.long)
    crow[1:] = torch.bincount(dst, minlength=n).cumsum(0)
    csr = torch.sparse_csr_tensor(crow, src, torch.ones(e, dtype=torch.float64), (n, n))
    coo = torch.sparse_coo_tensor(
        torch.stack([ei[1], ei[0]]), torch.ones(e), (n, n)
    )  # uncoalesced: duplicates kept
    for adj, attr in ((csr, ea[perm]), (coo, ea)):
        torch.manual_seed(1)
        out = model(x, adj, attr, *rest)
        assert (out - expected).abs().max() <= 1e-12 * expected.abs().max(), adj.layout


def test_sparse_adjacency_errors():
    from revgnn.nn.graph_input import sparse_to_edge_index

    ei = torch.tensor([[0, 0, 1], [1, 1, 2]])
    summed = torch.sparse_coo_tensor(ei.flip(0), torch.ones(3), (3, 3)).coalesce()  # the duplicate becomes 2
    with pytest.raises(ValueError, match="values other than 1 .*duplicate edges"):
        sparse_to_edge_index(summed.to_sparse_csr(), 3)
    with pytest.raises(ValueError, match=r"must be \[4, 4\]"):
        sparse_to_edge_index(summed, 4)


# ------------------------------------------------------------------------------------------ devices


def test_process_group_backend_follows_the_device(monkeypatch):
    """A CPU run on a machine with CUDA gets gloo; NCCL only for CUDA tensors."""
    import torch.distributed as dist

    from revgnn.distributed import comm

    chosen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: chosen.append(backend))
    monkeypatch.setattr(comm, "_exchange_workers", lambda: None)  # a collective of the joined group
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    comm.init_distributed(timeout_s=5)
    comm.init_distributed(timeout_s=5, device=torch.device("cpu"))
    comm.init_distributed(timeout_s=5, device=torch.device("cuda", 0))
    assert chosen == ["gloo", "gloo", "nccl"]


def test_rng_capture_is_device_generic_or_a_clear_error():
    from revgnn.nn.invertible import _device_rng, capture_rng, replay_rng, rng_advanced

    assert _device_rng(torch.device("cpu")) is None and _device_rng(torch.device("meta")) is None
    assert _device_rng(torch.device("cuda")) is torch.cuda  # torch's module for the device type
    with pytest.raises(RuntimeError, match="cannot record the random state of privateuseone tensors"):
        _device_rng(torch.device("privateuseone"))
    state = capture_rng(torch.device("cpu"))
    first = torch.rand(3)
    assert rng_advanced(state)
    with replay_rng(state):
        assert torch.equal(torch.rand(3), first)


def test_quantized_reversible_stack_reads_no_value_per_layer():
    """GroupAddRev(quantize=...) checks its range on the device and reads it back (a host sync on a GPU)
    at calls 1, 2, 4, ...: 64 blocks forward read it 7 times in all, not once per block. The graph is
    sorted once, as a model does before its blocks (the fused aggregation takes sorted edges; a plain
    edge_index would be sorted and checked in every call)."""
    from conftest import HostSyncs

    from revgnn.nn import GENBlock, GroupAddRev
    from revgnn.nn.graph_input import segments, sort_edges

    n = 30
    ei = torch.randint(0, n, (2, 120), generator=torch.Generator().manual_seed(0))
    ei, _ = sort_edges(ei, None, n)
    segments(ei, n)  # the source order, kept with the graph, as the first block of a model computes it
    block = GroupAddRev(GENBlock(4, aggr="mean"), num_groups=2, quantize=16)
    x = torch.randn(n, 8)
    with torch.no_grad(), HostSyncs() as syncs:
        for _ in range(64):
            x = block(x, ei)
    assert syncs.count == 7  # calls 1, 2, 4, 8, 16, 32, 64


@pytest.mark.parametrize("solver,per_iteration", [("fixed_point", 6), ("anderson", 9), ("broyden", 11)])
def test_deq_solver_host_syncs_per_iteration(solver, per_iteration):
    """Each solver iteration reads values back to the host (the residual and stopping tests): counted
    here so that the number cannot grow unnoticed (documented in docs/guides/deq.md)."""
    from conftest import HostSyncs, TanhMap

    from revgnn.deq import get_solver

    torch.manual_seed(0)
    f, x = TanhMap(5), torch.randn(30, 5, dtype=torch.float64)
    counts = []
    for iters in (10, 20):
        with HostSyncs() as syncs:
            get_solver(solver)(lambda z: f(z, x), torch.zeros_like(x), tol=1e-30, max_iter=iters)
        counts.append(syncs.count)
    assert (counts[1] - counts[0]) / 10 == per_iteration
