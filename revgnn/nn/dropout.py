r"""Dropout whose mask is drawn once per forward pass and shared by all layers."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn


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
    when :math:`p = 0`, meaning "no dropout"); blocks multiply by it.

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

    def forward(self, like: Tensor) -> Optional[Tensor]:
        """A fresh mask shaped like ``like``, scaled by :math:`1/(1-p)`."""
        if not self.training or self.p == 0.0:
            return None
        return torch.empty_like(like).bernoulli_(1.0 - self.p).div_(1.0 - self.p)

    def reset_parameters(self) -> None:
        """No parameters; present for a uniform model API."""

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(p={self.p})"
