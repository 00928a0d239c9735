"""The one kernel-dispatch table (revgnn.nn.dispatch): every operator's implementations, one rule."""

import ast
from pathlib import Path

import pytest
import torch
from conftest import REPO, require_kernel

from revgnn.nn import dispatch, kernels
from revgnn.utils.registry import UnknownName


def test_unknown_operator_is_an_error_naming_the_closest():
    with pytest.raises(UnknownName, match=r"unknown kernel 'gen_maxx' \(did you mean 'gen_max'"):
        dispatch.select("gen_maxx", torch.zeros(2, 2))


def test_every_row_names_existing_sources_and_triton_functions():
    from revgnn.nn import triton_kernels as tk

    for spec in dispatch.KERNEL_TABLE.values():
        if spec.source is not None:
            assert (kernels.SOURCE_DIR / f"{spec.source}.cpp").is_file(), spec
        for entry, function in spec.triton.items():
            assert callable(getattr(tk, function)), (spec.name, entry, function)


def test_every_cpp_source_serves_an_operator():
    used = {spec.source for spec in dispatch.KERNEL_TABLE.values()}
    assert set(kernels.sources()) <= used, set(kernels.sources()) - used


@pytest.mark.parametrize("name", dispatch.KERNEL_TABLE.names())
def test_the_cpp_module_has_every_entry_point(name):
    spec = dispatch.kernel_spec(name)
    require_kernel(spec.source)
    module = kernels.load(spec.source)
    missing = [entry for entry in spec.entries if not hasattr(module, entry)]
    assert not missing, (name, missing)


def test_the_rule(monkeypatch):
    require_kernel("gen_max")
    x = torch.zeros(4, 3)
    assert dispatch.implementation("gen_max", x) == "cpp"
    assert dispatch.implementation("gen_max", x.double()) == "cpp"
    # other dtypes, mixed dtypes, too many edges for int32 offsets: PyTorch
    assert dispatch.implementation("gen_max", x.half()) == "torch"
    assert dispatch.implementation("gen_max", x, x.double()) == "torch"
    assert dispatch.implementation("gen_max", x, num_edges=2**31) == "torch"
    monkeypatch.setenv("REVGNN_KERNELS", "0")
    assert dispatch.select("gen_max", x) is None
    monkeypatch.setenv("REVGNN_KERNELS", "bogus")
    with pytest.raises(ValueError, match="REVGNN_KERNELS='bogus'"):
        dispatch.select("gen_max", x)


def test_source_order_is_asked_of_the_implementation_that_runs(monkeypatch):
    """gen_aggr's C++ and PyTorch backwards walk the destination order; only its Triton backward reads
    the source order, which the aggregate operator's C++ backward also reduces over."""
    require_kernel("gen_aggr")
    require_kernel("aggregate")
    x = torch.zeros(4, 3)
    assert dispatch.kernel_spec("gen_aggr").source_order == ("triton",)
    assert not dispatch.reads_source_order("gen_aggr", x)
    assert dispatch.reads_source_order("aggregate", x)
    monkeypatch.setenv("REVGNN_KERNELS", "0")
    assert not dispatch.reads_source_order("aggregate", x)
    with pytest.raises(ValueError, match=r"source_order names no implementation \['cuda'\]"):
        dispatch.register_kernel("bad_row", None, {}, source_order=("cuda",))
    assert "bad_row" not in dispatch.KERNEL_TABLE.names()


def test_triton_mode_without_the_interpreter_is_an_error(monkeypatch):
    """``REVGNN_KERNELS=triton`` on CPU tensors without Triton's interpreter raises rather than falling
    back silently (in a process where Triton was imported compiled)."""
    from revgnn.nn import triton_kernels as tk

    if tk.INTERPRETED:
        pytest.skip("this process runs Triton's interpreter")
    monkeypatch.setenv("REVGNN_KERNELS", "triton")
    with pytest.raises(RuntimeError, match="REVGNN_KERNELS=triton: no Triton implementation of 'gen_max'"):
        dispatch.select("gen_max", torch.zeros(2, 2))


def test_no_other_module_chooses_an_implementation():
    """Only dispatch.py reads the kernel mode or loads a C++ module for an operator; the rest of
    the package asks dispatch.select (AST scan: calls of kernels.mode / kernels.load)."""
    offenders = []
    for path in sorted((Path(REPO) / "revgnn").rglob("*.py")):
        if path.name in ("dispatch.py", "kernels.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in ("mode", "load", "enabled", "triton")
                and isinstance(node.value, ast.Name)
                and node.value.id == "kernels"
            ):
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno} kernels.{node.attr}")
    assert not offenders, offenders


def test_sar_shard_operators_pick_triton_on_cuda():
    """Every operator SAR's shard forms call (``ops.<name>`` in revgnn/distributed, AST scan) is a row
    of the table whose rule picks Triton for CUDA tensors (fake ones: this machine may have no GPU),
    in the dtypes the shards run in: no shard form is gated to the C++ kernels."""
    pytest.importorskip("triton")
    from torch._library.custom_ops import CustomOpDef
    from torch._subclasses.fake_tensor import FakeTensorMode

    from revgnn.nn import triton_kernels as tk

    if not tk.AVAILABLE:
        pytest.skip("Triton is not usable here")
    called = set()
    for path in sorted((Path(REPO) / "revgnn" / "distributed").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "ops"
            ):
                called.add(node.attr)
    from revgnn.nn import ops

    # The operators among them (not helpers such as ops.dropout_threshold)
    operators = {name for name in called if isinstance(getattr(ops, name), CustomOpDef)}
    rows = {name.removesuffix("_backward").removesuffix("_shard") for name in operators}
    assert {"gen_max", "aggregate", "segment_max", "gen_aggr", "gat_attention"} <= rows, rows
    with FakeTensorMode():
        for dtype in (torch.float32, torch.float64):
            x = torch.empty(3, 2, dtype=dtype, device="cuda")
            for row in sorted(rows):
                assert dispatch.implementation(row, x, x, num_edges=10) == "triton", (row, dtype)
