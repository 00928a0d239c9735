r"""Dropout whose mask is drawn once per forward pass and shared by all layers."""

from __future__ import annotations

from typing import Dict, Optional

import torch
from torch import Tensor, nn


def _scales(p: float) -> Dict[torch.dtype, float]:
    """dtype -> the value of a kept entry of a float mask of dropout probability ``p``."""
    dtypes = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
    return {dtype: torch.ones((), dtype=dtype, device="cpu").div_(1.0 - p).item() for dtype in dtypes}


class SharedDropout(nn.Module):
    r"""Draws one dropout mask per forward pass for all layers of a deep model.

    RevGNN (Li et al., 2021) applies the same mask in every reversible block of
    a forward pass: the mask is an explicit argument of each block, so the
    backward pass reuses it without replaying a random number generator, and a
    :class:`~revgnn.nn.GroupAddRev` hands each group its slice of it.

    .. math::
        \mathbf{M} \sim \frac{\mathrm{Bernoulli}(1 - p)}{1 - p}, \qquad
        \mathrm{block}_\ell(\mathbf{X}) = \ldots\,(\mathbf{M} \odot \mathbf{H}_\ell)\ldots

    Calling the module returns the mask (or :obj:`None` in ``eval()`` mode or
    when :math:`p = 0`, meaning "no dropout"); blocks multiply by it. With
    ``compact=True`` the mask is bool (true where kept: a quarter of the float
    mask's bytes, held for the whole forward and backward pass) and blocks take
    its scale as ``dropout_scale=shared_dropout.scale(dtype)``; the products are
    those of the float mask, whose kept entries hold that same scale.

    Args:
        p (float, optional): Probability of zeroing an element.
            (default: :obj:`0.5`)

    Example:
        >>> import torch
        >>> from revgnn.nn import GENBlock, GroupAddRev, SharedDropout
        >>> shared_dropout = SharedDropout(p=0.1)
        >>> blocks = [GroupAddRev(GENBlock(16), num_groups=2) for _ in range(3)]
        >>> h, edge_index = torch.randn(10, 32), torch.randint(0, 10, (2, 40))
        >>> mask = shared_dropout(h)            # once per forward pass
        >>> for block in blocks:
        ...     h = block(h, edge_index, dropout_mask=mask)
        >>> h.shape
        torch.Size([10, 32])
    """

    def __init__(self, p: float = 0.5):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = p
        self._scales = (p, _scales(p))

    def forward(self, like: Tensor, compact: bool = False) -> Optional[Tensor]:
        """A fresh mask shaped like ``like``, scaled by :math:`1/(1-p)`; with ``compact`` the same
        draws as a bool mask (true where kept; the same random stream as the float mask)."""
        if not self.training or self.p == 0.0:
            return None
        keep = torch.empty_like(like).bernoulli_(1.0 - self.p)
        return keep.bool() if compact else keep.div_(1.0 - self.p)

    def scale(self, dtype: torch.dtype) -> float:
        """The value of a kept entry of the float mask in ``dtype`` (:math:`1/(1-p)` rounded as the
        float mask rounds it): a compact mask's ``dropout_scale``. Computed once per ``p`` for
        every floating dtype, outside any compiled region, so a compiled model reads no tensor."""
        if self._scales[0] != self.p:
            self._scales = (self.p, _scales(self.p))
        return self._scales[1][dtype]

    def reset_parameters(self) -> None:
        """No parameters; present for a uniform model API."""

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(p={self.p})"
