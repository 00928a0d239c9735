"""Test-wide settings, fixtures and helpers.

The tests are laid out like the package (``tests/<subpackage>/``, docs/testing.md). Helpers shared by
several test files live here and are imported by name (``from conftest import rel_err``), as are the
shared modules beside this file (``loop_models``, ``sar_cases``, ``zoo_cases``): pytest puts this
directory on ``sys.path`` for every test below it, wherever it is started from. Paths are built from
:data:`REPO`, never from the working directory or a test file's place.
"""

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# torch.compile's on-disk cache (torch 2.13.0) does not key its CPU kernels by ATEN_CPU_CAPABILITY:
# after a run at another level it reuses kernels built for that one, which gave wrong gradients
# (18.9 for 0.08) and segfaults here. One cache per level, set before torch is imported.
_LEVEL = os.environ.get("ATEN_CPU_CAPABILITY", "native")
os.environ.setdefault(
    "TORCHINDUCTOR_CACHE_DIR", os.path.join(tempfile.gettempdir(), f"torchinductor_revgnn_{_LEVEL}")
)

# The operators check their graph inputs (pointer, source ids, winner offsets) before any kernel runs,
# so a test that hands one a broken graph fails with an error rather than reading out of bounds.
os.environ.setdefault("REVGNN_KERNEL_CHECKS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

# The tests use tiny graphs: one thread avoids OpenMP spin-waiting, which makes small ops many
# times slower when the cores are shared with other processes.
torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]
CONFIG_DIR = str(REPO / "revgnn" / "configs")

#: Overrides for a 400-node ``proteins_like`` graph and a 2-layer, 8-channel model.
TINY_GRAPH = [
    "data.num_nodes=400",
    "data.window=5",
    "data.avg_degree=6",
    "data.max_hops=2",
    "model.num_layers=2",
    "model.hidden_channels=8",
]
#: Overrides for a whole ``revgnn-train`` run that finishes in seconds (tiny graph and model, one epoch).
TINY_RUN = [
    *TINY_GRAPH,
    "trainer.eval_parts=1",
    "trainer.epochs=1",
    "logger.progress_bar=false",
    "logger.plot=false",
    "backend.num_threads=1",
]


#: The keys of a run's history, ``metrics.csv`` and summary that are measurements, not results.
TIMING = {"epoch_time_s", "peak_memory_mb"}


def assert_same_run(a_dir, b_dir):
    """The runs in ``a_dir`` and ``b_dir`` are the same run bitwise: the weights of ``last.pt``, its
    history and best score, and ``metrics.csv``, all but the :data:`TIMING` measurements."""
    import csv

    from revgnn.engine.checkpoint import load_checkpoint

    strip = lambda rows: [{k: v for k, v in r.items() if k not in TIMING} for r in rows]
    a, b = load_checkpoint(str(a_dir / "last.pt")), load_checkpoint(str(b_dir / "last.pt"))
    assert a["model"].keys() == b["model"].keys()
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    assert strip(a["history"]) == strip(b["history"]) and a["best"] == b["best"]
    with open(a_dir / "metrics.csv") as f, open(b_dir / "metrics.csv") as g:
        assert strip(csv.DictReader(f)) == strip(csv.DictReader(g))


def rel_err(a: torch.Tensor, b: torch.Tensor, floor: float = 1e-30) -> float:
    r"""Relative error of ``a`` against the reference ``b``, :math:`\max|a - b| / \max|b|`: the
    largest deviation over the reference's largest entry (floored at ``floor``), so that entries near
    zero are judged at the scale of the whole tensor. Shapes must match; two empty tensors agree."""
    if a.shape != b.shape:
        raise AssertionError(f"shape {tuple(a.shape)} vs {tuple(b.shape)}")
    if a.numel() == 0:
        return 0.0
    return ((a - b).abs().max() / b.abs().max().clamp_min(floor)).item()


def adjacency_forms(edge_index, n):
    """Every form of the same graph a block accepts, in PyG's ``adj_t`` convention for the sparse ones
    (duplicate edges dropped: a sparse tensor would sum them), with the plain ``[2, E]`` edge list."""
    from torch_geometric import EdgeIndex

    edge_index = torch.unique(edge_index, dim=1).contiguous()
    ones = torch.ones(edge_index.size(1), dtype=torch.float64)
    coo = torch.sparse_coo_tensor(edge_index.flip(0), ones, (n, n)).coalesce()
    forms = {
        "edge_index": edge_index,
        "EdgeIndex": EdgeIndex(edge_index, sparse_size=(n, n)),
        "EdgeIndex_sorted": EdgeIndex(edge_index, sparse_size=(n, n)).sort_by("col")[0],
        "EdgeIndex_csc": EdgeIndex(edge_index, sparse_size=(n, n)).sort_by("col")[0],
        "sparse_coo": coo,
        "sparse_csr": coo.to_sparse_csr(),
    }
    forms["EdgeIndex_csc"].get_csc()  # its pointer filled: taken as it is, not sorted again
    try:
        from torch_sparse import SparseTensor

        forms["SparseTensor"] = SparseTensor.from_edge_index(edge_index, sparse_sizes=(n, n)).t()
    except ImportError:
        pass
    return edge_index, forms


class CLIRun(subprocess.CompletedProcess):
    """A finished command: ``returncode``, ``stdout``, ``stderr``, and ``output``."""

    @property
    def output(self) -> str:
        """stdout then stderr, stripped: all the user sees of the run."""
        return (self.stdout + self.stderr).strip()


@contextlib.contextmanager
def keyed_gat_dropout(edge_index, num_nodes: int, heads: int, p: float, seed):
    """While active, ``torch.nn.functional.dropout`` (what PyG's ``GATConv`` calls on its attention
    coefficients) applies the fused operator's mask instead (:func:`revgnn.nn.ops.attention_keep`
    of ``seed``, rate ``p``): PyG's edges are the graph's without self loops, in order (id: the
    column in ``edge_index``), then node i's loop (id E + i). On a destination-sorted graph the
    columns are the positions the operator keys by; a SAR shard keys by them (its ``edge_ids``) on
    any graph. Yields the list of the shapes it was called with."""
    from unittest import mock

    from torch_geometric import EdgeIndex

    from revgnn.nn import ops

    ei = edge_index.as_tensor() if isinstance(edge_index, EdgeIndex) else edge_index
    ids = torch.cat([(ei[0] != ei[1]).nonzero().flatten(), ei.size(1) + torch.arange(num_nodes)])
    keep = ops.attention_keep(seed, ids, heads, p)
    calls = []

    def dropout(alpha, p=0.5, training=True):
        calls.append(tuple(alpha.shape))
        return alpha * (keep.to(alpha.dtype) / (1 - p)) if training else alpha

    with mock.patch.object(torch.nn.functional, "dropout", dropout):
        yield calls


def gat_with_keyed_dropout(conv, x, edge_index, edge_attr, seed):
    """PyG's ``GATConv`` (``conv``, in training mode) with the fused operator's attention-dropout
    mask (:func:`keyed_gat_dropout`)."""
    from torch_geometric import EdgeIndex

    ei = edge_index.as_tensor() if isinstance(edge_index, EdgeIndex) else edge_index
    n, heads = x.size(0), conv.heads
    with keyed_gat_dropout(ei, n, heads, conv.dropout, seed) as calls:
        out = conv(x, ei, edge_attr=edge_attr)
    assert len(calls) == 1 and calls[0][1] == heads, calls
    return out


def gat_operator_case(dtype=torch.float64, seed: int = 0):
    """Inputs of ``torch.ops.revgnn.gat_attention`` on a small destination-sorted multigraph (self
    loops, duplicates, an isolated node; 3 heads, raw edge features with a bias), as a dict of its
    keyword arguments without ``negative_slope``, ``p``, ``seed``; plus ``"key"``, a permutation of
    the edges' positions (ids a SAR shard might pass: ``edge_key``) and ``"loop_key"`` ids past them."""
    g = torch.Generator().manual_seed(seed)
    n, e, heads, c, d = 20, 90, 3, 4, 2
    src = torch.randint(0, n - 1, (e,), generator=g)
    dst = torch.randint(0, n - 1, (e,), generator=g)
    src[:3], dst[:3] = torch.tensor([2, 2, 5]), torch.tensor([2, 2, 5])  # loops, a duplicate
    order = torch.sort(dst * n + src, stable=True).indices
    src, dst = src[order], dst[order]
    ptr = torch.zeros(n + 1, dtype=torch.long)
    ptr[1:] = torch.cumsum(torch.bincount(dst, minlength=n), 0)
    perm = torch.sort(src, stable=True).indices
    rowptr = torch.zeros(n + 1, dtype=torch.long)
    rowptr[1:] = torch.cumsum(torch.bincount(src, minlength=n), 0)

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)

    case = dict(
        xp=rand(n, heads, c), a_src=rand(n, heads), a_dst=rand(n, heads), loop=rand(n, heads),
        ptr=ptr, src=src, attr=rand(e, d), edge_w=rand(heads, d), edge_b=rand(heads),
        rowptr=rowptr, col=dst[perm].contiguous(), perm=perm,
    )  # fmt: skip
    case["key"] = torch.randperm(e, generator=g) * 7 + 1000
    case["loop_key"] = torch.randperm(n, generator=g) + 5000
    return case


def gat_operator_run(case, p, edge_key=None, loop_key=None):
    """``gat_attention`` of :func:`conftest.gat_operator_case` ``case`` (seed 11, slope 0.2) and its
    backward of a fixed weighting: the output and the gradients of every float input."""
    from revgnn.nn import ops

    names = ("xp", "a_src", "a_dst", "loop", "attr", "edge_w", "edge_b")
    inputs = {k: v.clone().requires_grad_() if k in names else v for k, v in case.items()}
    out, _, _ = ops.gat_attention(
        inputs["xp"], inputs["a_src"], inputs["a_dst"], inputs["loop"], inputs["ptr"], inputs["src"],
        inputs["attr"], inputs["edge_w"], inputs["edge_b"], 0.2, p, torch.tensor(11), inputs["rowptr"],
        inputs["col"], inputs["perm"], edge_key, loop_key,
    )  # fmt: skip
    (out * torch.linspace(-1, 2, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
    return [out.detach()] + [inputs[k].grad for k in names]


def run_cli(*args, cwd=None, env=None, unset=(), timeout=300, expect=0) -> CLIRun:
    """``python *args`` in a fresh interpreter (``args`` as after ``python``: ``"-m", "revgnn.train",
    *overrides``), the way the tests run every command of the package: this tree first on the path
    (``revgnn``, ``benchmarks``), then ``tests/`` (``model._target_=loop_models.<factory>``), then the
    caller's PYTHONPATH; ``REVGNN_ALLOCATOR=system`` (no tcmalloc re-exec: the tests read the
    command's own output, and tests/utils/test_launch.py tests the re-exec); ``env`` added to this
    process's environment and the variables in ``unset`` removed. Asserts the exit status is
    ``expect`` (``None``: not checked), naming the command and the end of its output."""
    path = [str(REPO), str(REPO / "tests"), *filter(None, [os.environ.get("PYTHONPATH")])]
    full = {**os.environ, "PYTHONPATH": os.pathsep.join(path), "REVGNN_ALLOCATOR": "system", **(env or {})}
    for key in unset:
        full.pop(key, None)
    cmd = [sys.executable, *map(str, args)]
    proc = subprocess.run(cmd, cwd=cwd, env=full, capture_output=True, text=True, timeout=timeout)
    run = CLIRun(proc.args, proc.returncode, proc.stdout, proc.stderr)
    if expect is not None:
        assert run.returncode == expect, (
            f"exit status {run.returncode}, not {expect}: {cmd}\n{run.output[-4000:]}"
        )
    return run


@pytest.fixture
def train_cli(tmp_path):
    """``run(name, *overrides)``: ``python -m revgnn.train *overrides name=NAME`` in ``tmp_path``
    (:func:`run_cli`), asserted to succeed; returns Hydra's run directory for it."""

    def run(name, *overrides):
        run_cli("-m", "revgnn.train", *overrides, f"name={name}", cwd=tmp_path)
        (run_dir,) = (tmp_path / "outputs" / name).iterdir()
        return run_dir

    return run


def require_kernel(name: str = "gen_max") -> None:
    """Skips without a C++ compiler or with REVGNN_KERNELS=0; fails if a compiler is there but
    the kernel ``name`` did not build."""
    from revgnn.nn import kernels

    if not kernels.enabled():
        pytest.skip("REVGNN_KERNELS=0")
    if kernels.load(name) is None:
        if shutil.which(os.environ.get("CXX", "c++")) is None:
            pytest.skip("no C++ compiler on this machine: the kernel cannot be built")
        pytest.fail("the C++ kernel did not build although a compiler is installed (see the warning)")


@pytest.fixture(params=["kernel", "torch"])
def impl(request, monkeypatch):
    """Runs a test once through the C++ kernels and once through the PyTorch path."""
    from revgnn.nn import kernels

    if request.param == "kernel":
        for name in kernels.sources():
            require_kernel(name)
    else:
        monkeypatch.setenv("REVGNN_KERNELS", "0")
    return request.param


def compose(overrides=(), config_name="train"):
    """The composed ``config_name`` (default ``train.yaml``) of the package's configs, with ``overrides``."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from revgnn.config.store import register_configs

    register_configs()

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return hydra_compose(config_name=config_name, overrides=list(overrides))


def compose_train(out_dir, *overrides):
    """The composed ``train.yaml`` with ``overrides`` and ``output_dir=out_dir`` (no plot, no bar)."""
    cfg = compose(["logger.plot=false", "logger.progress_bar=false", *overrides])
    cfg.output_dir = str(out_dir)
    return cfg


class TanhMap(torch.nn.Module):
    """A small contractive DEQ map in float64, ``z -> tanh(0.6 Linear(z) + x)``, for the DEQ tests."""

    def __init__(self, n=5):
        super().__init__()
        self.lin = torch.nn.Linear(n, n).double()

    def forward(self, z, x):
        return torch.tanh(0.6 * self.lin(z) + x)


class HostSyncs(torch.overrides.TorchFunctionMode):
    """Counts the reads of a tensor's value by the host (``.item()``, ``bool()``, ``float()``,
    ``int()``, ``.tolist()``): each one waits for the device on a GPU."""

    READS = {
        torch.Tensor.item,
        torch.Tensor.__bool__,
        torch.Tensor.__float__,
        torch.Tensor.__int__,
        torch.Tensor.tolist,
    }

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.READS:
            self.count += 1
        return func(*args, **(kwargs or {}))


def published_score(experiment: str) -> str:
    """The score ``experiment`` reproduces as its source publishes it (``"87.74 ± 0.13"`` for
    ``proteins_revgnn_deep``), read from the model registry: the tests take the paper's figures from
    there, never as literals of their own."""
    from revgnn.models.registry import paper_result

    return paper_result(experiment)[1].score()


def run_summary(**fields):
    """A :class:`~revgnn.engine.reports.Summary` of a made-up completed run of ``revgnn_deep``;
    ``fields`` replace its values."""
    from revgnn.engine.reports import Summary
    from revgnn.models import model_info

    base = dict(
        name="run",
        seed=0,
        model="revgnn_deep",
        data="ogbn-proteins",
        metric="rocauc",
        num_parameters=model_info("revgnn_deep").num_parameters,
        epochs=2000,
        best_epoch=2000,
        highest_train=0.9,
        highest_valid=0.8,
        final_test=0.79,
        checkpoint_test=None,
        epoch_time_s=40.0,
        peak_memory_mb=1000.0,
        device="cpu",
        bf16=False,
        backend="local",
        world_size=1,
        status="completed",
        output_dir="outputs/run",
    )
    return Summary(**{**base, **fields})
