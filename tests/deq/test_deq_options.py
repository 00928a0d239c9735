"""DEQ options: register_solver, separate forward/backward stop modes, evaluation budget, fixed-point
correction, and the errors for options that cannot work."""

import pytest
import torch
from conftest import TanhMap

from revgnn.deq import DEQ, SOLVERS, fixed_point, register_solver


@pytest.fixture
def spy():
    """A user's solver (fixed-point iteration) that records the settings of every call."""
    calls = []

    def mine(f, z0, *, max_iter=50, tol=1e-4, stop_mode="rel", damping=1.0):
        calls.append(dict(max_iter=max_iter, tol=tol, stop_mode=stop_mode, damping=damping))
        return fixed_point(f, z0, max_iter=max_iter, tol=tol, stop_mode=stop_mode, damping=damping)

    register_solver("spy", mine)
    yield calls
    SOLVERS.unregister("spy")


def test_register_solver_and_separate_stop_modes_and_eval_budget(spy):
    deq = DEQ(
        TanhMap(),
        solver="spy",
        solver_options={"damping": 0.9},
        max_iter=60,
        eval_max_iter=7,
        tol=1e-9,
        backward_stop_mode="abs",
        backward_tol=1e-11,
    )
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    deq(x).sum().backward()
    assert spy == [
        dict(max_iter=60, tol=1e-9, stop_mode="rel", damping=0.9),
        dict(max_iter=60, tol=1e-11, stop_mode="abs", damping=0.9),
    ]
    deq.eval()
    with pytest.warns(RuntimeWarning):  # 7 evaluations are not enough for 1e-9
        deq(x)
    assert spy[-1]["max_iter"] == 7 and deq.stats["forward_steps"] == 7
    with pytest.raises(TypeError, match="batch"):
        deq(x, batch=torch.zeros(3, dtype=torch.long))
    with pytest.raises(TypeError, match="keep"):
        DEQ(TanhMap(), solver="spy", correction_states=1)


def test_register_solver_validates_the_signature(spy):
    def no_tol(f, z0, *, max_iter=1, stop_mode="rel"):
        pass

    def three(f, z0, extra, *, max_iter=1, tol=1.0, stop_mode="rel"):
        pass

    def loose(f, z0, *, max_iter=1, tol=1.0, stop_mode="rel", **kw):
        pass

    with pytest.raises(TypeError, match="keyword-only tol"):
        register_solver("a", no_tol)
    with pytest.raises(TypeError, match="3 positional"):
        register_solver("b", three)
    with pytest.raises(TypeError, match=r"\*\*kwargs"):
        register_solver("c", loose)
    with pytest.raises(ValueError, match="already registered"):
        register_solver("anderson", fixed_point)
    with pytest.raises(TypeError, match="callable"):
        register_solver("d", 3)
    assert not {"a", "b", "c", "d"} & set(SOLVERS)
    with pytest.raises(ValueError, match="may not set"):
        DEQ(TanhMap(), solver_options={"tol": 1e-3})
    with pytest.raises(ValueError, match="^solver must be one of the registered solvers .* register_solver"):
        DEQ(TanhMap(), solver="newton")


def test_fixed_point_correction_supervises_intermediate_iterates():
    torch.manual_seed(0)
    deq = DEQ(
        TanhMap(), solver="fixed_point", tol=1e-30, max_iter=30, correction_states=2, correction_gamma=0.5
    )
    x = torch.randn(3, 5, dtype=torch.float64)
    with pytest.warns(RuntimeWarning):
        deq(x)
    states = deq.correction_states()
    assert [w for w, _ in states] == [0.25, 0.5]  # iterates 10 and 20: lambda^2, lambda^1
    z = torch.zeros_like(x)
    iterates = {}
    with torch.no_grad():
        for k in range(1, 21):
            iterates[k] = z
            z = deq.f(z, x)
    for (_, state), k in zip(states, (10, 20)):
        assert torch.allclose(state, deq.f(iterates[k], x), rtol=0, atol=1e-14)
        assert state.requires_grad  # one-step gradient into the parameters
    assert deq.correction_states() == []  # handed over once
    with pytest.warns(RuntimeWarning):
        deq(x)
    with pytest.raises(RuntimeError, match="never collected"):
        deq(x)
    deq.eval()
    deq.correction_states()
    with pytest.warns(RuntimeWarning):
        deq(x)
    assert deq.correction_states() == []  # none in evaluation
    with pytest.raises(ValueError, match="exceeds max_iter"):
        DEQ(TanhMap(), max_iter=3, correction_states=4)


def test_deq_gnn_fixed_point_correction_through_auxiliary_loss():
    from revgnn.engine.loop import model_auxiliary_loss
    from revgnn.models.deq_gnn import DEQGNN

    torch.manual_seed(0)
    model = DEQGNN(6, 8, 3, max_iter=12, tol=1e-30, correction_states=2, jac_reg_weight=0.1)
    x = torch.randn(20, 6)
    edge_index = torch.randint(0, 20, (2, 60))
    with pytest.warns(RuntimeWarning):
        model(x, edge_index)
    states = [(w, z.detach()) for w, z in model.deq._corrections]
    jac = model.deq._aux[0].item()
    y = torch.randn(20, 3)

    def loss(out):
        return (out - y).square().mean()

    aux = model_auxiliary_loss(model, loss)
    model.eval()  # the head's dropout is 0 here; eval only to compare without randomness
    expected = jac + sum(w * loss(model.head(z)).item() for w, z in states)
    assert aux.item() == pytest.approx(expected, rel=1e-5)
    assert model_auxiliary_loss(model, loss) is None


def test_deqgnn_forwards_every_deq_option_and_checks_them_against_deq():
    """DEQGNN copies none of DEQ's options: its ``**deq_options`` are DEQ.__init__'s parameters
    (but the map and unroll_steps, which the model sets), checked by name and type before DEQ
    is built."""
    from revgnn.models import DEQGNN
    from revgnn.nn import conv_spec
    from revgnn.utils.signature import keyword_parameters

    deq_keys = list(keyword_parameters(DEQ, skip=("f", "unroll_steps")))
    assert list(DEQGNN.forwarded_options({})[0]) == deq_keys + list(conv_spec("gen").options)
    assert list(DEQGNN.forwarded_options({"conv": "gat"})[0]) == deq_keys + list(conv_spec("gat").options)
    model = DEQGNN(6, 8, 3, solver="broyden", backward_solver="anderson", backward_solver_options={"m": 3})
    assert (model.deq.solver, model.deq.backward_solver) == ("broyden", "anderson")
    assert model.deq.backward_solver_options == {"m": 3}  # an option DEQGNN never listed
    assert DEQGNN(6, 8, 3, pretrain_depth=3).deq.unroll_steps == 3
    with pytest.raises(
        TypeError,
        match=r"DEQGNN has no option\(s\) max_iters \(did you mean max_iter\?\); its DEQ takes solver",
    ):
        DEQGNN(6, 8, 3, max_iters=3)
    with pytest.raises(TypeError, match=r"has no option\(s\) unroll_steps.*; its DEQ takes solver, max_iter"):
        DEQGNN(6, 8, 3, unroll_steps=2)
    with pytest.raises(
        TypeError, match=r"has no option\(s\) agr \(did you mean aggr\?\).*its conv 'gen' takes aggr"
    ):
        DEQGNN(6, 8, 3, agr="mean")
    with pytest.raises(ValueError, match="^aggr must be one of"):
        DEQGNN(6, 8, 3, aggr="median")
    with pytest.raises(TypeError, match="^max_iter must be an int, got '3'$"):
        DEQGNN(6, 8, 3, max_iter="3")
    with pytest.raises(ValueError, match="^solver must be one of the registered solvers anderson, broyden"):
        DEQGNN(6, 8, 3, solver="newton")
