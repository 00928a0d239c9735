r"""Weight and spectral normalisation for the weights of any equilibrium map :math:`f`.

A DEQ evaluates :math:`f` tens of times per forward pass, so its weights must be the *same* function of
the parameters at every evaluation: :func:`torch.nn.utils.parametrizations.spectral_norm` updates its
power-iteration vectors at every call in training mode, which changes the map between solver iterations
(there is then no fixed point to find). Here the normalised weight is a pure function of the parameters
and of buffers that change only in :func:`reset_norm`, called once per optimiser step:

* ``"weight"`` (Salimans & Kingma, 2016): :math:`\mathbf{W} = g_i \, \mathbf{v}_i / \|\mathbf{v}_i\|_2`
  per output row :math:`i`, with learnt magnitudes :math:`g_i` (at application :math:`g_i =
  \|\mathbf{w}_i\|`, so the map is unchanged); nothing to reset.
* ``"spectral"`` (Miyato et al., 2018, as a bound): :math:`\mathbf{W} = \mathbf{V} / \max(1,
  \hat\sigma / c)` with :math:`\hat\sigma = \mathbf{u}^\top \mathbf{V} \mathbf{v}` the power-iteration
  estimate of the largest singular value of :math:`\mathbf{V}` (reshaped to ``[out, -1]``): its spectral norm
  is at most :math:`c` (:obj:`bound`) once :math:`\mathbf{u}, \mathbf{v}` have converged, and weights
  already below the bound are left as they are. :func:`reset_norm` takes :obj:`iters` power-iteration
  steps from the previous vectors (warm start: the weights move a little per step).

Example::

    >>> import torch
    >>> from revgnn.deq.norm import apply_norm, reset_norm, remove_norm
    >>> _ = torch.manual_seed(0)
    >>> f = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8))
    >>> names = apply_norm(f, "spectral", bound=0.9)          # ['0.weight', '2.weight']
    >>> bool(torch.linalg.matrix_norm(f[0].weight, 2) <= 0.9 + 1e-6)
    True
    >>> reset_norm(f)                                        # after every optimiser step
    >>> remove_norm(f)                                       # plain parameters again, same values
    ['0.weight', '2.weight']
"""

from __future__ import annotations

from typing import Annotated, List, Literal, Sequence, get_args

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from revgnn.utils.ranges import Range
from revgnn.utils.signature import check_call

__all__ = ["WEIGHT_NORMS", "apply_norm", "reset_norm", "remove_norm"]

#: The normalisations :func:`apply_norm` applies to a map's weights (``kind``); not the feature
#: norms of a block (``revgnn.nn.blocks.NORMS``).
WeightNorm = Literal["weight", "spectral"]
WEIGHT_NORMS = get_args(WeightNorm)


class SpectralBound(nn.Module):
    r"""Parametrization :math:`\mathbf{V} \mapsto \mathbf{V} / \max(1, \mathbf{u}^\top\mathbf{V}\mathbf{v}
    / c)` with fixed buffers :math:`\mathbf{u}, \mathbf{v}` (updated only by :meth:`power_`)."""

    def __init__(self, weight: Tensor, bound: float, iters: int):
        super().__init__()
        rows = weight.reshape(weight.size(0), -1)
        g = torch.Generator(device="cpu").manual_seed(0)
        u = torch.randn(rows.size(0), generator=g, dtype=rows.dtype).to(rows.device)
        self.register_buffer("u", u / torch.linalg.vector_norm(u))
        self.register_buffer("v", torch.zeros(rows.size(1), dtype=rows.dtype, device=rows.device))
        self.bound, self.iters = float(bound), int(iters)
        self.power_(weight, 50)  # converged vectors from the start

    @torch.no_grad()
    def power_(self, weight: Tensor, iters: int) -> None:
        r"""Power-iteration steps :math:`\mathbf{v} \leftarrow \mathbf{V}^\top\mathbf{u}/\|\cdot\|`,
        :math:`\mathbf{u} \leftarrow \mathbf{V}\mathbf{v}/\|\cdot\|` from the current vectors."""
        rows = weight.reshape(weight.size(0), -1)
        u, v = self.u, self.v
        for _ in range(iters):
            v = rows.T @ u
            v = v / torch.linalg.vector_norm(v).clamp_min(1e-30)
            u = rows @ v
            u = u / torch.linalg.vector_norm(u).clamp_min(1e-30)
        self.u.copy_(u)
        self.v.copy_(v)

    def sigma(self, weight: Tensor) -> Tensor:
        return self.u @ weight.reshape(weight.size(0), -1) @ self.v

    def forward(self, weight: Tensor) -> Tensor:
        scale = torch.clamp(self.sigma(weight) / self.bound, min=1.0)
        return weight / scale

    def extra_repr(self) -> str:
        return f"bound={self.bound:g}, iters={self.iters}"


def _targets(module: nn.Module, names: Sequence[str]):
    for mod_name, mod in module.named_modules():
        for name in names:
            param = mod._parameters.get(name) if not parametrize.is_parametrized(mod, name) else None
            if isinstance(param, nn.Parameter) and param.dim() >= 2:
                yield f"{mod_name}.{name}" if mod_name else name, mod, name


def apply_norm(
    module: nn.Module,
    kind: WeightNorm = "weight",
    names: Sequence[str] = ("weight",),
    bound: Annotated[float, Range(0, low_open=True)] = 1.0,
    iters: Annotated[int, Range(1)] = 1,
) -> List[str]:
    r"""Normalise every parameter called one of :obj:`names` with at least two dimensions (matrices,
    convolution kernels; not LayerNorm's gains) in :obj:`module` and its children.

    Args:
        module (torch.nn.Module): the map :math:`f` (or any module).
        kind (str, optional): :obj:`"weight"` or :obj:`"spectral"`. (default: :obj:`"weight"`)
        names (sequence of str, optional): parameter names to normalise. (default: :obj:`("weight",)`)
        bound (float, optional): spectral-norm bound :math:`c > 0` (:obj:`"spectral"`). (default: :obj:`1.0`)
        iters (int, optional): power-iteration steps per :func:`reset_norm` (:obj:`"spectral"`).
            (default: :obj:`1`)

    Returns:
        The qualified names of the normalised parameters.

    Raises:
        ValueError: an unknown :obj:`kind`, a bound or step count out of range, or no parameter to
            normalise (a misspelt name must not pass silently).
    """
    check_call(apply_norm, locals(), prefix="apply_norm: ")
    done = []
    for qualified, mod, name in list(_targets(module, names)):
        if kind == "weight":
            torch.nn.utils.parametrizations.weight_norm(mod, name, dim=0)
        else:
            parametrize.register_parametrization(mod, name, SpectralBound(getattr(mod, name), bound, iters))
        done.append(qualified)
    if not done:
        raise ValueError(
            f"apply_norm: no parameter named {list(names)} with >= 2 dimensions (and not normalised already) "
            f"in {type(module).__name__}"
        )
    return done


def reset_norm(module: nn.Module) -> None:
    r"""Update the spectral normalisations in :obj:`module` to its current parameters (their
    :obj:`iters` power-iteration steps); call after every optimiser step, before the next forward.
    Weight normalisation has no state: nothing to do for it."""
    for mod in module.modules():
        if not parametrize.is_parametrized(mod):
            continue
        for plist in mod.parametrizations.values():
            for p in plist:
                if isinstance(p, SpectralBound):
                    p.power_(plist.original, p.iters)


def remove_norm(module: nn.Module) -> List[str]:
    r"""Replace every weight or spectral normalisation in :obj:`module` by a plain parameter holding the
    normalised value (the map is unchanged); returns the qualified names."""
    done = []
    for mod_name, mod in list(module.named_modules()):
        if not parametrize.is_parametrized(mod):
            continue
        for name in list(mod.parametrizations.keys()):
            kinds = {type(p).__name__ for p in mod.parametrizations[name]}
            if kinds & {"SpectralBound", "_WeightNorm"}:
                parametrize.remove_parametrizations(mod, name, leave_parametrized=True)
                done.append(f"{mod_name}.{name}" if mod_name else name)
    return done
