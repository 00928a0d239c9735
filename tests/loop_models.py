"""Models for the training-loop tests: a zoo model with a side effect at its k-th training forward.

Each factory takes the model config's keys (``name`` picks the zoo model, e.g. ``revgnn_small``) and
is used as ``model._target_=loop_models.<factory>``; ``at_call`` and ``only_rank`` may also come from
the environment (``LOOP_MODELS_AT_CALL``, ``LOOP_MODELS_RANK``) for runs started as a command
(:func:`conftest.run_cli` puts tests/ on their path). In-process runs set it with :func:`with_model`.
"""

import os
import signal

import torch
from torch import nn

from revgnn.models import create_model


def with_model(cfg, factory: str, **kwargs):
    """``cfg`` (a composed ``train.yaml``) with its model built by ``loop_models.<factory>``: the
    model config's keys (those set) plus ``kwargs``."""
    from omegaconf import OmegaConf

    model = OmegaConf.to_container(cfg.model)
    model = {k: v for k, v in model.items() if v is not None}
    cfg.model = OmegaConf.create({**model, "_target_": f"loop_models.{factory}", **kwargs})
    return cfg


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


def _params(at_call, only_rank):
    at_call = int(os.environ.get("LOOP_MODELS_AT_CALL", "0")) if at_call is None else at_call
    if only_rank is None and "LOOP_MODELS_RANK" in os.environ:
        only_rank = int(os.environ["LOOP_MODELS_RANK"])
    return at_call, only_rank


def _on_call(model: nn.Module, at_call, only_rank, pre=None, post=None) -> nn.Module:
    at_call, only_rank = _params(at_call, only_rank)
    calls = [0]

    def due(module) -> bool:
        if not module.training:
            return False
        calls[0] += 1
        return calls[0] >= at_call > 0 and (only_rank is None or _rank() == only_rank)

    if pre is not None:
        model.register_forward_pre_hook(lambda m, args: pre(calls[0]) if due(m) else None)
    if post is not None:
        model.register_forward_hook(lambda m, args, out: post(out) if due(m) else None)
    return model


def signal_at(name, at_call=None, only_rank=None, signum=signal.SIGTERM, **kwargs):
    """Sends itself ``signum`` once, at its ``at_call``-th training forward."""
    sent = [False]

    def send(call):
        if not sent[0]:
            sent[0] = True
            os.kill(os.getpid(), signum)

    return _on_call(create_model(name, **kwargs), at_call, only_rank, pre=send)


def nan_at(name, at_call=None, only_rank=None, **kwargs):
    """Returns NaN logits from its ``at_call``-th training forward on."""
    return _on_call(create_model(name, **kwargs), at_call, only_rank, post=lambda out: out * float("nan"))


def nan_in_evaluation(name, only_rank=None, **kwargs):
    """Trains as the zoo model does but returns NaN logits in evaluation (``model.eval()``) on
    ``only_rank`` (every rank when :obj:`None`): a divergence first seen by an evaluation."""
    _, only_rank = _params(0, only_rank)
    model = create_model(name, **kwargs)

    def poison(module, args, out):
        if not module.training and (only_rank is None or _rank() == only_rank):
            return out * float("nan")

    model.register_forward_hook(poison)
    return model


def inf_gradient_at(name, at_call=None, only_rank=None, **kwargs):
    """From its ``at_call``-th training forward on, the backward through its output is infinite
    (the loss stays finite): a divergence first seen in the gradient norm."""

    def blow_up(out):
        out.register_hook(lambda g: g * float("inf"))

    return _on_call(create_model(name, **kwargs), at_call, only_rank, post=blow_up)


def fail_at(name, at_call=None, only_rank=None, **kwargs):
    """Raises ``RuntimeError`` at its ``at_call``-th training forward: a failure inside an epoch."""

    def fail(call):
        raise RuntimeError(f"loop_models.fail_at: training forward {call}")

    return _on_call(create_model(name, **kwargs), at_call, only_rank, pre=fail)


def solver_diverges_at(name, at_call=None, only_rank=None, **kwargs):
    """Raises a DEQ solver's :class:`~revgnn.deq.SolverDivergenceError` at its ``at_call``-th training
    forward (on ``only_rank`` alone): a divergence that one worker's own solve sees first."""
    from revgnn.deq import SolverDivergenceError

    def diverge(call):
        raise SolverDivergenceError(
            f"loop_models.solver_diverges_at: f(z) contains NaN/inf at forward {call}"
        )

    return _on_call(create_model(name, **kwargs), at_call, only_rank, pre=diverge)


def solver_diverges_in_evaluation(name, only_rank=None, **kwargs):
    """Trains as the zoo model does, but its evaluation forwards raise a DEQ solver's
    :class:`~revgnn.deq.SolverDivergenceError` on ``only_rank`` (every rank when :obj:`None`)."""
    from revgnn.deq import SolverDivergenceError

    _, only_rank = _params(0, only_rank)
    model = create_model(name, **kwargs)

    def diverge(module, args):
        if not module.training and (only_rank is None or _rank() == only_rank):
            raise SolverDivergenceError("loop_models.solver_diverges_in_evaluation: f(z) contains NaN/inf")

    model.register_forward_pre_hook(diverge)
    return model


def exit_at(name, at_call=None, only_rank=None, **kwargs):
    """Dies without a word (``os._exit(3)``) at its ``at_call``-th training forward: a crashed worker."""
    return _on_call(create_model(name, **kwargs), at_call, only_rank, pre=lambda call: os._exit(3))


class EpochRecorder(nn.Module):
    """A zoo model that records the epochs the loop announced with ``set_epoch`` in a buffer."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner
        self.register_buffer("epochs_seen", torch.zeros(0))

    def set_epoch(self, epoch: int) -> None:
        self.epochs_seen = torch.cat([self.epochs_seen, torch.tensor([float(epoch)])])

    def forward(self, *args):
        return self.inner(*args)


def epoch_recorder(name, **kwargs):
    return EpochRecorder(create_model(name, **kwargs))


def float64(name, **kwargs):
    """The zoo model in float64, its floating-point inputs cast to float64 (for exactness tests)."""
    model = create_model(name, **kwargs).double()
    model.register_forward_pre_hook(
        lambda m, args: tuple(
            a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args
        )
    )
    return model


class _StatsHook(nn.Module):
    """Runs ``action`` at its ``at_call``-th ``epoch_stats`` call on ``only_rank`` (the loop calls a
    submodule's ``epoch_stats`` once after an epoch's training and once after its evaluation, just
    before ``last.pt`` is gathered and written)."""

    def __init__(self, at_call, only_rank, action):
        super().__init__()
        self.calls, self.action = 0, action
        self.at_call, self.only_rank = _params(at_call, only_rank)

    def epoch_stats(self):
        self.calls += 1
        if self.calls == self.at_call and (self.only_rank is None or _rank() == self.only_rank):
            self.action()
        return {}


def stop_in_epoch_stats(name, at_call=None, only_rank=None, **kwargs):
    """Stops itself (SIGSTOP: alive, connections open, no progress) at the ``at_call``-th
    ``epoch_stats`` call of a submodule: a worker that hangs while its peers gather for a checkpoint."""
    model = create_model(name, **kwargs)
    model.stats_hook = _StatsHook(at_call, only_rank, lambda: os.kill(os.getpid(), signal.SIGSTOP))
    return model
