"""torch.compile of the zoo models (CPU, inductor): graph breaks per model (counted, so they cannot grow
unnoticed), compiled gradients equal to eager's in float64, the reversible backward still recomputing
under compile (saved bytes flat in depth), and ``trainer.compile`` through the one loop."""

import csv

import pytest
import torch
from test_torch2 import zoo_case

from revgnn.utils import SavedTensorBytes

# graph breaks of the eval forward (no grad) and of a training forward + loss, as torch._dynamo.explain
# counts them on zoo_case's 2-layer models (a plain edge_index): one where the graph models sort it
# (eagerly: an EdgeIndex cannot be built inside a compiled graph), one more per reversible block in
# training (its call runs eagerly: torch.compile cannot capture the reconstructing backward); measured
BREAKS = {
    "mlp": (0, 0),
    "gnn_1layer": (1, 2),
    "resgnn_small": (1, 2),
    "revgnn_small": (1, 3),
    "wt_revgnn": (1, 3),
    "revgnn_products": (1, 3),
}


def _explain(fn, *args):
    torch._dynamo.reset()
    return torch._dynamo.explain(fn)(*args)


@pytest.mark.parametrize("name", sorted(BREAKS))
def test_graph_breaks_per_model(name):
    model, args = zoo_case(name, dtype=torch.float32)
    eval_breaks, train_breaks = BREAKS[name]
    model.eval()
    with torch.no_grad():
        assert _explain(model, *args).graph_break_count == eval_breaks
    model.train()
    explained = _explain(lambda *a: model(*a).square().mean(), *args)
    assert explained.graph_break_count == train_breaks, [b.reason for b in explained.break_reasons]


COMPILED = sorted(BREAKS)


@pytest.mark.parametrize("name", COMPILED)
def test_compiled_gradients_equal_eager(name):
    """float64, eval mode (no dropout: inductor draws its own random numbers) with grad: the compiled
    forward + backward gives eager's gradients to 1e-10 relative, reversible backward included."""
    model, args = zoo_case(name, dtype=torch.float64)
    model.eval()
    model(*args).square().mean().backward()
    eager = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    torch.compile(model)(*args).square().mean().backward()
    for k, g in eager.items():
        got = dict(model.named_parameters())[k].grad
        assert got is not None, k
        assert (got - g).norm() <= 1e-10 * max(g.norm(), 1e-30), k


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
    inductor draws its own random numbers). With the default model (GEN *mean* aggregation, PyG's
    message passing) dynamo failed in the full suite, building a ``torch_geometric.Index`` inside the
    graph ("'Index' object has no attribute '_data'"), though not when this file ran alone: the fused
    GEN max model is what this test checks; docs/guides/blocks.md says which models compile."""
    from conftest import TINY_RUN, compose_train

    from revgnn.engine.checkpoint import load_checkpoint
    from revgnn.engine.loop import train

    summaries = {}
    for compiled in (False, True):
        cfg = compose_train(
            tmp_path / str(compiled),
            *TINY_RUN,
            "model=revgnn_small",  # the fused GEN max path (see the docstring)
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

    with pytest.raises(ValueError, match="trainer.compile=true is not supported with backend=sar"):
        SARBackend(compose(["backend=sar", "trainer.compile=true"]))
