r"""Weight tying: one block applied many times."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from revgnn.nn.invertible import InvertibleModule


class WeightTied(nn.Module):
    r"""Applies one block :math:`L` times with the same weights (WT-RevGNN, Li et al. 2021).

    .. math::
        \mathbf{X}^{(\ell)} = f_{\mathbf{w}}(\mathbf{X}^{(\ell-1)}, \ldots),
        \qquad \ell = 1, \ldots, L

    Parameters are :math:`O(1)` in :math:`L`. When ``block`` is an
    :class:`~revgnn.nn.InvertibleModule` (such as :class:`~revgnn.nn.GroupAddRev`),
    training memory is :math:`O(1)` in :math:`L` too; gradients of the shared
    weights are summed over the :math:`L` applications by autograd. Extra
    arguments are passed unchanged to every application.

    Args:
        block (torch.nn.Module): A shape-preserving block, reversible or plain.
        num_layers (int): How many times to apply it, :math:`L \ge 1`.
        keep_every (int, optional): For an invertible block, store the input of
            every ``keep_every``-th application instead of reconstructing it,
            which bounds float32 reconstruction drift (:obj:`0`: never).
            (default: :obj:`0`)
    """

    def __init__(self, block: nn.Module, num_layers: int, keep_every: int = 0):
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"WeightTied needs num_layers >= 1, got {num_layers}")
        if keep_every and not isinstance(block, InvertibleModule):
            raise ValueError(
                f"keep_every needs an invertible block (an InvertibleModule such as GroupAddRev), "
                f"got {type(block).__name__}; pass keep_every=0 for a plain block"
            )
        self.block = block
        self.num_layers = num_layers
        self.keep_every = keep_every

    def reset_parameters(self) -> None:
        if hasattr(self.block, "reset_parameters"):
            self.block.reset_parameters()

    def forward(self, x: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        if not self.keep_every:
            for _ in range(self.num_layers):
                x = self.block(x, *args, **kwargs)
            return x
        default = self.block.keep_input
        try:
            for layer in range(self.num_layers):
                self.block.keep_input = layer > 0 and layer % self.keep_every == 0
                x = self.block(x, *args, **kwargs)
        finally:
            self.block.keep_input = default
        return x

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.block}, num_layers={self.num_layers})"


class BlockSequence(nn.ModuleList):
    r"""Distinct blocks applied in turn, each receiving the same extra arguments:
    the untied counterpart of :class:`WeightTied`,
    :math:`\mathbf{X}^{(\ell)} = f_{\mathbf{w}_\ell}(\mathbf{X}^{(\ell-1)}, \ldots)`.
    Parameter names are those of a :class:`torch.nn.ModuleList`."""

    def reset_parameters(self) -> None:
        for block in self:
            if hasattr(block, "reset_parameters"):
                block.reset_parameters()

    def forward(self, x: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        for block in self:
            x = block(x, *args, **kwargs)
        return x
