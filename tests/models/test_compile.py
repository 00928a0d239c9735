"""torch.compile of the zoo models (CPU, inductor): graph breaks per model (counted, so they cannot grow
unnoticed), compiled gradients equal to eager's in float64, the reversible backward still recomputing
under compile (saved bytes flat in depth), and ``trainer.compile`` through the one loop."""

import csv

import pytest
import torch
from torch._dynamo.utils import counters
from zoo_cases import PATHS, ZOO, gradients_equal, zoo_case

from revgnn.utils import SavedTensorBytes

# graph breaks of the eval forward (no grad) and of a training forward + loss, as torch._dynamo.explain
# counts them on zoo_case's 2-layer models (a plain edge_index, sorted inside the graph): one per
# reversible block in training (its call runs eagerly: torch.compile cannot capture the reconstructing
# backward), one where a DEQ solves (eagerly: a data-dependent loop); GAT no longer breaks in eval (PyG's
# remove_self_loops kept a data-dependent number of edges: 6 breaks; the fused attention masks them); measured
BREAKS = {
    "deq_gnn": (1, 2),
    "deq_gnn_small": (1, 2),
    "gnn_1layer": (0, 0),
    "mlp": (0, 0),
    "resgnn": (0, 0),
    "resgnn_small": (0, 0),
    "revgat_arxiv": (0, 2),
    "revgnn_112": (0, 2),
    "revgnn_deep": (0, 2),
    "revgnn_mol_small": (0, 2),
    "revgnn_molhiv": (0, 2),
    "revgnn_molhiv_batchnorm": (0, 2),
    "revgnn_products": (0, 2),
    "revgnn_proteins_like": (0, 2),
    "revgnn_small": (0, 2),
    "revgnn_wide": (0, 2),
    "wt_revgnn": (0, 2),
}


def _explain(fn, *args):
    torch._dynamo.reset()
    return torch._dynamo.explain(fn)(*args)


@pytest.mark.parametrize("name", ZOO)
def test_graph_breaks_per_model(name):
    model, args = zoo_case(name, dtype=torch.float32)
    eval_breaks, train_breaks = BREAKS[name]
    model.eval()
    with torch.no_grad():
        assert _explain(model, *args).graph_break_count == eval_breaks
    model.train()
    explained = _explain(lambda *a: model(*a).square().mean(), *args)
    assert explained.graph_break_count == train_breaks, [b.reason for b in explained.break_reasons]


@pytest.mark.parametrize("name", ["revgnn_small", "wt_revgnn"])
def test_eval_with_grad_enabled_compiles_as_training_does(name):
    """``model.eval()`` alone still builds a graph: each reversible call runs eagerly, so the forward
    breaks as in training (the table of docs/guides/blocks.md); only ``no_grad`` gives 0 breaks. The
    compiled eval forward's gradients equal eager's."""
    model, args = zoo_case(name, dtype=torch.float64)
    model.train()
    train = _explain(model, *args)
    model.eval()
    explained = _explain(model, *args)
    assert (explained.graph_count, explained.graph_break_count) == (
        train.graph_count,
        train.graph_break_count,
    )
    assert explained.graph_break_count >= 1
    torch._dynamo.reset()
    compiled = torch.compile(model)
    grads = []
    for fn in (model, compiled):
        model.zero_grad()
        fn(*args).square().mean().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for eager, comp in zip(*grads):
        assert torch.allclose(comp, eager, rtol=1e-10, atol=1e-12 * max(1.0, eager.abs().max().item()))


def test_every_zoo_model_has_its_breaks_counted():
    assert sorted(BREAKS) == sorted(ZOO)


KERNEL_PATHS = ["revgnn_small", "deq_gnn_small"]  # also kernels off: both kernels, reversible and implicit


def _compiled_gradients(name):
    """float64, eval mode (no dropout: inductor draws its own random numbers) with grad: the compiled
    forward + backward gives eager's gradients, reversible and DEQ implicit backward included."""
    model, args = zoo_case(name, dtype=torch.float64)
    model.eval()
    model(*args).square().mean().backward()
    eager = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    counters.clear()
    torch.compile(model)(*args).square().mean().backward()
    failed = [reason for reason in counters["graph_break"] if "Backend compiler" in reason]
    assert not failed, failed  # inductor compiled every graph (no silent fallback to eager)
    gradients_equal({k: p.grad for k, p in model.named_parameters()}, eager)


@pytest.mark.parametrize("name", [n for n in PATHS if n not in KERNEL_PATHS])
def test_compiled_gradients_equal_eager(name):
    _compiled_gradients(name)


@pytest.mark.parametrize("name", KERNEL_PATHS)
def test_compiled_gradients_equal_eager_kernels_on_and_off(name, impl):
    _compiled_gradients(name)


def test_compiled_graph_holds_no_edge_index_subclass():
    """No PyG ``EdgeIndex`` (a tensor subclass) reaches a compiled graph, as input or inside: with one
    there, AOTAutograd's trace log (on whenever ``torch.__trace`` has a handler: ``TORCH_TRACE``, or
    pytest's log capture) prints it, ``EdgeIndex.__repr__`` reads fake values and the compile falls
    back to eager, frame by frame. Checked with an ``EdgeIndex`` input (the loop's batches) too."""
    from torch_geometric import EdgeIndex

    from revgnn.nn.graph_input import sort_edges

    seen = []

    def backend(gm, example_inputs):
        seen.extend(type(t).__name__ for t in example_inputs if isinstance(t, torch.Tensor))
        return gm.forward

    model, (x, ei, ea) = zoo_case("revgnn_proteins_like", dtype=torch.float32)  # PyG and revgnn's ops
    sorted_ei, sorted_ea = sort_edges(ei, ea, x.size(0))
    assert isinstance(sorted_ei, EdgeIndex)
    for args in ((x, ei, ea), (x, sorted_ei, sorted_ea)):
        torch._dynamo.reset()
        with torch.no_grad():
            torch.compile(model.eval(), backend=backend)(*args)
    assert seen and set(seen) <= {"Tensor", "Parameter"}, set(seen)


def test_compiled_reversible_model_still_recomputes():
    """Saved-for-backward bytes of a compiled RevGNN's forward do not grow with depth (2 vs 12 blocks):
    the reversible call runs eagerly inside the compiled model (``torch.compiler.disable`` on
    ``apply_invertible``), so its backward reconstructs instead of storing."""
    from revgnn.models import create_model

    saved = []
    for depth in (2, 12):
        torch.manual_seed(0)
        model = create_model("revgnn_small", num_layers=depth).eval()
        _, args = zoo_case("revgnn_small", dtype=torch.float32)
        torch._dynamo.reset()
        compiled = torch.compile(model)
        with SavedTensorBytes() as counted:  # what the forward keeps for backward
            loss = compiled(*args).square().mean()
        loss.backward()
        saved.append(counted.bytes)
    assert 0 < saved[1] <= 1.05 * saved[0], saved


def test_trainer_compile_trains_through_the_one_loop(tmp_path):
    """``trainer.compile=true`` (local backend): the run completes, its checkpoint holds the module's own
    state dict (no ``_orig_mod.`` prefix) and its losses follow eager's to float32 rounding (dropout off:
    inductor draws its own random numbers). The default model (GEN *mean* aggregation through PyG's
    message passing), whose evaluation passes the compiled model an ``EdgeIndex``."""
    from conftest import TINY_RUN, compose_train

    from revgnn.engine.checkpoint import load_checkpoint
    from revgnn.engine.loop import train

    summaries = {}
    for compiled in (False, True):
        cfg = compose_train(
            tmp_path / str(compiled),
            *TINY_RUN,
            "model=revgnn_proteins_like",
            "trainer.epochs=2",
            "model.dropout=0",
            f"trainer.compile={compiled}",
        )
        torch._dynamo.reset()
        summaries[compiled] = train(cfg)
        state = load_checkpoint(str(tmp_path / str(compiled) / "last.pt"))["model"]
        assert not any(k.startswith("_orig_mod") for k in state)
    assert summaries[True]["status"] == "completed"
    losses = {}
    for compiled in (False, True):
        with open(tmp_path / str(compiled) / "metrics.csv") as f:
            losses[compiled] = [float(row["loss"]) for row in csv.DictReader(f) if row["loss"]]
    assert len(losses[True]) == len(losses[False]) == 2
    for a, b in zip(losses[True], losses[False]):
        assert abs(a - b) <= 1e-4 * abs(b), losses


def test_trainer_compile_is_refused_by_sar():
    from conftest import compose

    from revgnn.engine.sar_backend import SARBackend
    from revgnn.errors import ConfigError

    with pytest.raises(ConfigError, match="trainer.compile=true is not supported with backend=sar"):
        SARBackend.check_config(compose(["backend=sar", "backend.partition_dir=p", "trainer.compile=true"]))
