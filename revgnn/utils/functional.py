""":mod:`torch.func` support: whether a transform is running, and a module's tensors as its forward saw them.

revgnn's operators and reversible blocks take their plain PyTorch form under ``torch.func.grad``,
``vmap``, ``jacrev`` and the like (:func:`transforms_active`): custom autograd (the operators'
registered backward, the reversible blocks' recomputation) cannot be seen through by those
transforms, while the plain ops can be differentiated and batched. Memory then grows with depth as in
a plain model. :func:`plain_operators` asks for the same forms without a transform (a second
derivative).

Under :func:`torch.func.functional_call` a module computes with the tensors passed in, but autograd
runs the backward of a block that recomputes (a reversible block, a DEQ's implicit backward) after
``functional_call`` has put the module's own parameters back. The block records
:func:`module_tensors` in forward and recomputes inside :func:`bound_to` them, so the gradients go to
the tensors that were passed in.
"""

import contextlib
from typing import Dict, Iterator

import torch
from torch import Tensor, nn

__all__ = ["transforms_active", "plain_operators", "module_tensors", "bound_to"]

_plain_depth = 0  # how many plain_operators() bodies are running


def transforms_active() -> bool:
    """Whether a :mod:`torch.func` transform (``grad``, ``vmap``, ``jacrev``, ...) is running, or a
    :func:`plain_operators` body: where revgnn's operators take their plain PyTorch form. False while
    ``torch.compile`` traces: dynamo reads the interpreter stack as non-empty then (measured, torch
    2.13), and a compiled model must keep the reversible blocks' own backward."""
    if torch.compiler.is_compiling():
        return False
    return _plain_depth > 0 or torch._C._functorch.peek_interpreter_stack() is not None


@contextlib.contextmanager
def plain_operators() -> Iterator[None]:
    """Within the body every revgnn operator and block computes in plain PyTorch ops, as under a
    :mod:`torch.func` transform (:func:`transforms_active`): the same function, differentiable twice
    (the fused operators' registered backward is differentiable once), at the plain ops' memory.
    DEQ-GNN's map uses it for the Jacobian penalties, whatever its conv."""
    global _plain_depth
    _plain_depth += 1
    try:
        yield
    finally:
        _plain_depth -= 1


def module_tensors(module: nn.Module) -> Dict[str, Tensor]:
    """``module``'s parameters and buffers by name, as its forward sees them now (under
    :func:`torch.func.functional_call`: the tensors passed in)."""
    state: Dict[str, Tensor] = dict(module.named_parameters(remove_duplicate=False))
    state.update(module.named_buffers(remove_duplicate=False))
    return state


@contextlib.contextmanager
def bound_to(module: nn.Module, state: Dict[str, Tensor]) -> Iterator[None]:
    """Within the body, ``module`` computes with the tensors of ``state`` (from :func:`module_tensors`
    at forward time); a no-op where they are its own."""
    now = module_tensors(module)
    if now.keys() == state.keys() and all(now[k] is v for k, v in state.items()):
        yield
        return
    from torch.nn.utils.stateless import _reparametrize_module  # what functional_call itself uses

    with _reparametrize_module(module, state):
        yield
