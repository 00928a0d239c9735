"""The benchmark scripts' shared machinery (``benchmarks/common.py``): the parts whose results do not
depend on timing."""

import subprocess
import sys

import pytest
import torch
from conftest import run_cli

import benchmarks.common as benchlib


def test_destination_sorted_graph_is_sorted_seeded_and_aligned():
    ei, attr = benchlib.destination_sorted_graph(50, 400, seed=3, edge_channels=4)
    plain = ei.as_tensor()
    key = plain[1] * 50 + plain[0]
    assert plain.shape == (2, 400) and attr.shape == (400, 4) and bool((key[1:] >= key[:-1]).all())
    again, attr2 = benchlib.destination_sorted_graph(50, 400, seed=3, edge_channels=4)
    assert torch.equal(again.as_tensor(), plain) and torch.equal(attr2, attr)
    # the features travel with their edges: the unsorted draw, permuted the same way, gives them back
    g = torch.Generator().manual_seed(3)
    raw_ei, raw_attr = torch.randint(0, 50, (2, 400), generator=g), torch.rand(400, 4, generator=g)
    perm = (raw_ei[1] * 50 + raw_ei[0]).argsort()
    assert torch.equal(raw_ei[:, perm], plain) and torch.equal(raw_attr[perm], attr)


def test_proteins_subgraph_has_the_recipes_schema():
    x, ei, ea, y = benchlib.proteins_subgraph(30, 200, "cpu")
    assert x.shape == (30, 16) and ei.shape == (2, 200) and ea.shape == (200, 8) and y.shape == (30, 112)
    assert torch.equal(ei[:, :100], ei[:, 100:].flip(0)) and torch.equal(ea[:100], ea[100:])
    assert torch.allclose(x[:, :8], torch.zeros(30, 8).index_add_(0, ei[1], ea))
    assert torch.equal(x[:, 8:].sum(1), torch.ones(30))


def test_time_calls_counts_calls_and_syncs_and_median_skips_the_warmup():
    calls, syncs = [], []
    times = benchlib.time_calls(lambda: calls.append(1), 3, sync=lambda: syncs.append(1))
    assert len(times) == 3 and len(calls) == 3 and len(syncs) == 6 and all(t >= 0 for t in times)
    assert benchlib.median_after([100.0, 1.0, 3.0, 2.0]) == 2.0
    assert benchlib.median_after([5.0]) == 5.0  # only the warm-up: it is the figure
    assert benchlib.median_after([9.0, 1.0, 2.0], warmup=2) == 2.0


def test_child_env(monkeypatch):
    monkeypatch.setenv("_REVGNN_REEXEC", "1")
    monkeypatch.setenv("LD_PRELOAD", "libtcmalloc.so")
    monkeypatch.setenv("REVGNN_ALLOCATOR", "system")
    monkeypatch.setenv("GOMP_SPINCOUNT", "5")
    env = benchlib.child_env("system", strip=["GOMP_SPINCOUNT"], OMP_NUM_THREADS="1")
    assert "_REVGNN_REEXEC" not in env and "LD_PRELOAD" not in env and "GOMP_SPINCOUNT" not in env
    assert env["REVGNN_ALLOCATOR"] == "system" and env["OMP_NUM_THREADS"] == "1"
    default = benchlib.child_env("default")
    assert "REVGNN_ALLOCATOR" not in default and default["LD_PRELOAD"] == "libtcmalloc.so"
    assert benchlib.child_env()["REVGNN_ALLOCATOR"] == "system"  # None: as inherited


def test_run_child_returns_the_json_lines_and_raises_on_failure():
    code = "print('[12:00][log][INFO] started'); print('{\"a\": 1}'); print('not json'); print('[2, 3]')"
    assert benchlib.run_child([sys.executable, "-c", code]) == [{"a": 1}, [2, 3]]
    with pytest.raises(benchlib.ChildFailed, match=r"failed \(3\): .*boom") as err:
        benchlib.run_child([sys.executable, "-c", "import sys; sys.stderr.write('boom'); sys.exit(3)"])
    assert err.value.returncode == 3 and err.value.stderr == "boom"
    with pytest.raises(subprocess.TimeoutExpired):
        benchlib.run_child([sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.5)


def test_markdown_table():
    lines = benchlib.markdown_table(["a", "b", "c"], [[1, "x", ""], ["2", 3.5, "y"]], align="lr")
    assert lines == ["| a | b | c |", "|---|---:|---|", "| 1 | x | |", "| 2 | 3.5 | y |"]


def test_pyg_group_add_rev_swap_computes_the_same_model():
    """bench_step's ``--reversible pyg``: every block rewrapped in PyG's GroupAddRev around the same
    groups computes our model's function and parameter gradients (float64, no dropout) — except the
    shared edge encoder's: the model hands the blocks its edge embedding in factored form (a
    LinearEdgeFeatures, not a tensor), and PyG's wrapper differentiates only tensors passed directly,
    so that encoder gets no gradient through it (its cost in a step is one small linear layer)."""
    from revgnn.models import create_model
    from revgnn.nn import GroupAddRev

    torch.manual_seed(0)
    ours = create_model("revgnn_deep", num_layers=3, hidden_channels=8, dropout=0.0).double()
    theirs = create_model("revgnn_deep", num_layers=3, hidden_channels=8, dropout=0.0).double()
    theirs.load_state_dict(ours.state_dict())
    assert benchlib.with_pyg_group_add_rev(theirs) == 3
    assert not any(isinstance(m, GroupAddRev) for m in theirs.modules())
    x, ei, ea, _ = benchlib.proteins_subgraph(40, 300, "cpu")
    outs = [model(x.double(), ei, ea.double()) for model in (ours, theirs)]
    for out in outs:
        out.square().sum().backward()
    scale = outs[0].detach().abs().max()
    assert (outs[0] - outs[1]).detach().abs().max() <= 1e-12 * scale

    def grads(model, edge_encoder: bool):
        named = [(n, p) for n, p in model.named_parameters() if n.startswith("edge_encoder.") == edge_encoder]
        return torch.cat([(torch.zeros_like(p) if p.grad is None else p.grad).flatten() for _, p in named])

    a, b = grads(ours, False), grads(theirs, False)
    assert (a - b).norm() <= 1e-10 * a.norm()
    a, b = grads(ours, True), grads(theirs, True)
    assert a.norm() > 0 and b.norm() == 0


def test_bench_memory_measures_drift_at_the_depths_it_is_given():
    """``--depths 2`` measures the reconstruction drift at depth 2 too, not at the 1001 layers of the
    full run; ``--drift-depths`` still chooses them ("" for none)."""
    import benchmarks.memory as bench_memory

    assert bench_memory.parse_args(["--depths", "2"]).drift_depths == [2]
    assert bench_memory.parse_args([]).drift_depths == [8, 64, 256, 1001]
    assert bench_memory.parse_args(["--depths", "2", "--drift-depths", "10,100"]).drift_depths == [10, 100]
    assert bench_memory.parse_args(["--drift-depths", ""]).drift_depths == []


def test_bench_deq_peer_without_torchdeq_names_the_bench_extra(tmp_path):
    """``benchmarks.deq peer`` without torchdeq: one line saying it comes with the bench extra and how to
    install it, not a ModuleNotFoundError traceback."""
    hide = "import runpy, sys; sys.modules['torchdeq'] = None; "  # as if not installed
    code = (
        f"{hide}sys.argv = ['benchmarks.deq', 'peer', '--nodes', '50']; "
        "runpy.run_module('benchmarks.deq', run_name='__main__', alter_sys=True)"
    )
    text = run_cli("-c", code, cwd=tmp_path, expect=1).output
    assert "Traceback" not in text and len(text.splitlines()) == 1, text
    assert "torchdeq, which is not installed: it comes with revgnn's bench extra" in text, text
    assert 'pip install -e ".[bench]"' in text, text
