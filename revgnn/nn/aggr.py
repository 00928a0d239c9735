r"""Fused GENConv message + max aggregation over destination-sorted edges.

PyG's GENConv with ``aggr='max'`` builds the messages
:math:`\mathbf{m}_{ji} = \mathrm{ReLU}(\mathbf{x}_j + \mathbf{e}_{ji}) + \epsilon`
through its generic message-passing path (index expansions, an
:math:`E \times C` message tensor plus an :math:`E \times C` ReLU mask kept
for backward, then ``scatter_reduce`` amax whose backward allocates several
more edge-sized temporaries). :class:`GENMaxAggregate` computes the same
function with fewer passes over edge-sized memory:

.. math::
    \mathbf{h}_{i,c} = \max_{j \in \mathcal{N}(i)} \mathrm{ReLU}(\mathbf{x}_{j,c}
    + \mathbf{e}_{ji,c}) + \epsilon

* the message buffer is written once (gather, add, in-place ReLU) and the
  floor :math:`\epsilon` is added to the :math:`N \times C` result (equal:
  rounding is monotone);
* it keeps one :math:`E \times C` tensor for backward, the ReLU'd messages,
  from which the backward derives both the ReLU mask (:math:`> 0`) and the
  argmax mask (:math:`=` the maximum);
* ties split the gradient evenly, exactly as ``scatter_reduce`` amax does in
  PyG's CPU path. (torch-scatter's ``segment_max_csr`` returns an argmax, but
  was 11x slower than native ``scatter_reduce`` here: 15.4 vs 1.35 ms for
  200k x 32.)

Inside a reversible block the saved messages live only while that block's
backward runs, so memory stays flat in depth. Nodes without incoming edges
aggregate to 0, as in PyG.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from torch_geometric import EdgeIndex


def _by_destination(edge_index: Tensor, num_nodes: int) -> Tuple[Tensor, Tensor, Tensor, Optional[Tensor]]:
    """(source, destination) per edge in destination order, in-degree, and the permutation or None."""
    if not isinstance(edge_index, EdgeIndex):
        edge_index = EdgeIndex(edge_index, sparse_size=(num_nodes, num_nodes))
    perm = None
    if not edge_index.is_sorted_by_col:
        edge_index, perm = edge_index.sort_by("col")
    (colptr, _), _ = edge_index.get_csc()
    plain = edge_index.as_subclass(Tensor)
    return plain[0], plain[1], colptr.as_subclass(Tensor).diff(), perm


class GENMaxAggregate(torch.autograd.Function):
    """``max_j relu(x[src_j] + e_j) + eps`` per destination; see the module docstring."""

    @staticmethod
    def forward(ctx, x: Tensor, edge_attr: Optional[Tensor], src: Tensor, dst: Tensor,
                degree: Tensor, eps: float) -> Tensor:  # type: ignore[override]
        msg = x.index_select(0, src)  # a fresh E x C buffer: updated in place below
        if edge_attr is not None:
            msg.add_(edge_attr)
        msg.clamp_min_(0.0)
        index = dst.view(-1, 1).expand_as(msg)
        out = msg.new_zeros(degree.numel(), msg.size(1)).scatter_reduce_(
            0, index, msg, "amax", include_self=False)
        ctx.save_for_backward(msg, out, src, dst)
        ctx.has_edge_attr = edge_attr is not None
        result = out + eps
        return result.masked_fill_((degree == 0).view(-1, 1), 0.0)

    @staticmethod
    def backward(ctx, grad_out: Tensor):  # type: ignore[override]
        msg, out, src, dst = ctx.saved_tensors
        index = dst.view(-1, 1).expand_as(msg)
        winner = msg == out.index_select(0, dst)          # argmax mask (ties included)
        ties = out.new_zeros(out.shape).scatter_add_(0, index, winner.to(out.dtype))
        grad_msg = (grad_out / ties.clamp_min(1.0)).index_select(0, dst)
        grad_msg.mul_(winner & (msg > 0))                 # max, then ReLU
        grad_x = grad_e = None
        if ctx.needs_input_grad[0]:
            grad_x = torch.zeros_like(grad_out).index_add_(0, src, grad_msg)
        if ctx.has_edge_attr and ctx.needs_input_grad[1]:
            grad_e = grad_msg
        return grad_x, grad_e, None, None, None, None


def gen_max_aggregate(x: Tensor, edge_index: Tensor, edge_attr: Optional[Tensor] = None,
                      eps: float = 1e-7) -> Tensor:
    r"""Fused :math:`\max_{j \in \mathcal{N}(i)} \mathrm{ReLU}(\mathbf{x}_j +
    \mathbf{e}_{ji}) + \epsilon` (GENConv's max aggregation).

    Args:
        x (torch.Tensor): Node features ``[N, C]``.
        edge_index (torch.Tensor or torch_geometric.EdgeIndex): ``[2, E]``,
            source in row 0, destination in row 1. A destination-sorted
            ``EdgeIndex`` avoids a sort per call.
        edge_attr (torch.Tensor, optional): Edge features ``[E, C]`` in the
            order of ``edge_index``.
        eps (float, optional): The message floor :math:`\epsilon`.
    """
    src, dst, degree, perm = _by_destination(edge_index, x.size(0))
    if edge_attr is not None and perm is not None:
        edge_attr = edge_attr.index_select(0, perm)
    return GENMaxAggregate.apply(x, edge_attr, src, dst, degree, eps)


def gen_conv(conv, x: Tensor, edge_index, edge_attr: Optional[Tensor] = None) -> Tensor:
    """``conv(x, edge_index, edge_attr)`` for a PyG ``GENConv``, through
    :func:`gen_max_aggregate` when that computes the same function.

    The fused path applies to max aggregation with equal in/out channels and no
    message norm or internal edge encoder (edge features already encoded);
    anything else, or a non-tensor graph (``SparseTensor``, a distributed
    ``SARGraph``), calls the conv itself.
    """
    plain = not any(hasattr(conv, name) for name in
                    ("lin_src", "lin_dst", "lin_edge", "lin_aggr_out", "msg_norm"))
    if conv.aggr == "max" and plain and isinstance(edge_index, Tensor) and isinstance(x, Tensor):
        return conv.mlp(gen_max_aggregate(x, edge_index, edge_attr, conv.eps) + x)
    return conv(x, edge_index, edge_attr)
