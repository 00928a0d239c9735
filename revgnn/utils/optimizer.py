r"""A model's optimiser for training steps: the torch optimiser and, when flat, the parameter buffer.

:class:`ModelOptimizer` owns a ``torch.optim`` optimiser over a model's parameters, either per tensor
or over one :class:`~revgnn.utils.flat.FlatParameters` buffer, and the end of every training step
after ``backward``:

.. math::

    g \leftarrow \sum_{w=1}^{W} g_w, \qquad
    g \leftarrow g \cdot \min\Big(1, \frac{c}{\lVert g \rVert_2 + 10^{-6}}\Big), \qquad
    \theta \leftarrow \mathrm{step}(\theta, g), \qquad g \leftarrow 0

(the gradients summed over the ``W`` workers, clipped to the global norm ``c`` when ``max_norm`` > 0 as
``torch.nn.utils.clip_grad_norm_`` does, the update applied only when :math:`\lVert g \rVert_2` is
finite, then cleared). Clearing is one method, :meth:`ModelOptimizer.zero_grad`: zeroed in place in the
flat buffer (whose views must stay), freed otherwise. Its state (:meth:`~ModelOptimizer.state_dict`) is
the torch optimiser's; :attr:`~ModelOptimizer.layout` names the flat buffer's parameter layout, and
:meth:`~ModelOptimizer.load_state_dict` refuses state saved for another one (:class:`LayoutMismatch`).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Optional

import torch
from torch import Tensor, nn

from revgnn.utils.flat import FlatParameters

__all__ = ["ModelOptimizer", "LayoutMismatch"]


class LayoutMismatch(RuntimeError):
    """Optimiser state saved for another parameter layout than the optimiser's: per tensor against
    flat, or another flat layout (parameters, their order or the chunking). ``flat`` is the setting
    that would load it (``True``/``False``), or :obj:`None` when the flat layouts differ."""

    def __init__(self, message: str, flat: Optional[bool]):
        super().__init__(message)
        self.flat = flat


class ModelOptimizer:
    r"""The optimiser ``factory(params)`` over ``module``'s parameters, per tensor or (``flat``) over a
    :class:`~revgnn.utils.flat.FlatParameters` of ``module`` (checked to be element-wise), with the
    training step's gradient reduction, clipping, update and clearing (module docstring).

    Args:
        module (torch.nn.Module): The model, already on its device and dtype.
        factory (callable): Builds the ``torch.optim`` optimiser from an iterable of parameters (e.g. a
            Hydra-instantiated partial ``torch.optim.Adam``).
        flat (bool, optional): Keep the parameters in one buffer and their gradients in another
            (:mod:`revgnn.utils.flat`). (default: :obj:`True`)
        max_norm (float, optional): Clip the global gradient norm to this value; 0 does not clip.
            (default: :obj:`0.0`)

    Example:
        >>> import torch
        >>> model = torch.nn.Linear(8, 1)
        >>> optimizer = ModelOptimizer(model, lambda ps: torch.optim.Adam(ps, lr=1e-3), max_norm=1.0)
        >>> model(torch.randn(4, 8)).square().mean().backward()
        >>> norm = optimizer.step()  # sync, clip, update, clear
    """

    def __init__(
        self,
        module: nn.Module,
        factory: Callable[[Iterable[Tensor]], torch.optim.Optimizer],
        flat: bool = True,
        max_norm: float = 0.0,
    ):
        if max_norm < 0:
            raise ValueError(f"max_norm={max_norm} is negative; 0 does not clip")
        #: the :class:`~revgnn.utils.flat.FlatParameters` of the module, or :obj:`None` (per tensor)
        self.flat: Optional[FlatParameters] = FlatParameters(module) if flat else None
        #: the ``torch.optim`` optimiser (over the flat buffer's chunks, or the module's parameters)
        self.optimizer: torch.optim.Optimizer = factory(
            self.flat.params if self.flat is not None else module.parameters()
        )
        if self.flat is not None:
            FlatParameters.check_optimizer(self.optimizer)
        #: the global gradient norm :meth:`step` clips to (0: no clipping)
        self.max_norm = float(max_norm)

    @property
    def param_groups(self) -> List[Dict[str, Any]]:
        """The torch optimiser's parameter groups (``lr`` and the other options)."""
        return self.optimizer.param_groups

    @property
    def layout(self) -> Optional[str]:
        """The flat buffer's layout (:attr:`FlatParameters.layout`), or :obj:`None` per tensor."""
        return self.flat.layout if self.flat is not None else None

    def zero_grad(self) -> None:
        """Clears the gradients: zeroed in place in the flat buffer, freed (set to ``None``) per
        tensor."""
        if self.flat is not None:
            self.flat.zero_grad()
        else:
            self.optimizer.zero_grad(set_to_none=True)

    def step(self, reduce_gradients: Optional[Callable[[object], None]] = None) -> float:
        """The end of a training step, after ``backward``: brings the gradients into the flat buffer,
        sums them over workers (``reduce_gradients``, given the flat gradient or the parameters),
        clips their global norm to :attr:`max_norm`, updates, and clears them (:meth:`zero_grad`, so
        that they do not outlive the step).

        Returns the global gradient norm before clipping; when it is NaN or infinite no update is
        applied (the gradients are only cleared). It is the norm of the summed gradients, the same bits
        on every worker, so every worker skips the same step (:mod:`revgnn.engine.divergence`)."""
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        if self.flat is not None:
            self.flat.sync()
        if reduce_gradients is not None:
            reduce_gradients(self.flat.grad if self.flat is not None else params)
        # clip_grad_norm_ is exactly these two calls; the norm is taken whether or not it clips
        norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
        finite = bool(norm.isfinite())
        if finite and self.max_norm > 0:
            torch.nn.utils.clip_grads_with_norm_(params, self.max_norm, norm)
        if finite:
            self.optimizer.step()
        self.zero_grad()
        return float(norm)

    def state_dict(self) -> Dict[str, Any]:
        """The torch optimiser's state dict (its moments index the flat chunks when :attr:`layout` is
        set); save :attr:`layout` with it."""
        return self.optimizer.state_dict()

    def load_state_dict(self, state: Dict[str, Any], layout: Optional[str]) -> None:
        """Loads ``state`` saved with :attr:`layout` ``layout``; raises :class:`LayoutMismatch` when
        that is not this optimiser's layout (its moments would land on other parameters)."""
        if bool(layout) != (self.flat is not None):
            kind = "flat" if layout else "per-tensor"
            raise LayoutMismatch(f"optimiser state for {kind} parameters", flat=bool(layout))
        if self.flat is not None and layout != self.flat.layout:
            raise LayoutMismatch(
                "flat optimiser state for another parameter layout (parameters, their order or the "
                "chunking differ); its moments cannot be matched to this model's parameters",
                flat=None,
            )
        self.optimizer.load_state_dict(state)

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({type(self.optimizer).__name__}, flat={self.flat is not None})"
