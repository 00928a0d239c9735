r"""Fused GENConv message + max aggregation that stores no edge-sized tensor.

PyG's GENConv with ``aggr='max'`` materialises the messages
:math:`\mathbf{m}_{ji} = \mathrm{ReLU}(\mathbf{x}_j + \mathbf{e}_{ji}) + \epsilon`
as an :math:`E \times C` tensor, aggregates them with ``scatter_reduce``
(amax) and keeps edge-sized tensors for the backward pass, which then scans
all edges again. Only one edge per (node, channel) receives gradient, the
argmax, so :class:`GENMaxAggregate` saves just that index and the sign of the
pre-activation there (:math:`N \times C` each):

.. math::
    \mathbf{h}_{i,c} = \max_{j \in \mathcal{N}(i)} \mathbf{m}_{ji,c}, \qquad
    a_{i,c} = \arg\max_{j} \mathbf{m}_{ji,c}

    \frac{\partial L}{\partial \mathbf{x}_{j,c}} = \sum_{i : a_{i,c} = (j \to i)}
    \frac{\partial L}{\partial \mathbf{h}_{i,c}}\,
    \mathbb{1}[\mathbf{x}_{j,c} + \mathbf{e}_{ji,c} > 0], \qquad
    \frac{\partial L}{\partial \mathbf{e}_{ji,c}} = \frac{\partial L}{\partial
    \mathbf{h}_{i,c}}\,\mathbb{1}[a_{i,c} = (j \to i)]\,\mathbb{1}[\cdot > 0]

Nodes without incoming edges aggregate to 0, as in PyG. With torch-scatter
installed the max runs as ``segment_csr`` over destination-sorted edges
(which also returns the argmax); without it, native ``scatter_reduce``.

Ties: the gradient goes to one maximal edge, where PyG's native path splits
it evenly. Ties between messages only happen at the floor
:math:`\epsilon` (all pre-activations :math:`\le 0`, where the gradient is 0
either way) or between identical parallel edges, whose parameter gradients
are the same either way; gradients therefore equal PyG's.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch_geometric.typing
from torch import Tensor

from torch_geometric import EdgeIndex


def _csc(edge_index: Tensor, num_nodes: int) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    """(source per edge in destination order, destination pointer, edge permutation or None)."""
    if not isinstance(edge_index, EdgeIndex):
        edge_index = EdgeIndex(edge_index, sparse_size=(num_nodes, num_nodes))
    perm = None
    if not edge_index.is_sorted_by_col:
        edge_index, perm = edge_index.sort_by("col")
    (colptr, row), _ = edge_index.get_csc()
    return row.as_subclass(Tensor), colptr.as_subclass(Tensor), perm


class GENMaxAggregate(torch.autograd.Function):
    """``max_j relu(x[src_j] + e_j) + eps`` per destination; see the module docstring."""

    @staticmethod
    def forward(ctx, x: Tensor, edge_attr: Optional[Tensor], src: Tensor, ptr: Tensor,
                eps: float) -> Tensor:  # type: ignore[override]
        num_nodes, num_edges = ptr.numel() - 1, src.numel()
        z = x.index_select(0, src)  # a fresh E x C buffer: updated in place below
        if edge_attr is not None:
            z.add_(edge_attr)
        msg = z.clamp_min(0.0).add_(eps)
        out, arg = _segment_max(msg, ptr, num_nodes)
        empty = arg >= num_edges
        safe_arg = arg.masked_fill(empty, 0)
        positive = z.gather(0, safe_arg) > 0
        positive &= ~empty
        out.masked_fill_(empty, 0.0)
        ctx.save_for_backward(safe_arg, positive, src)
        ctx.num_nodes, ctx.num_edges = num_nodes, num_edges
        ctx.has_edge_attr = edge_attr is not None
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):  # type: ignore[override]
        arg, positive, src = ctx.saved_tensors
        g = grad_out * positive
        grad_x = grad_e = None
        if ctx.needs_input_grad[0]:
            grad_x = torch.zeros_like(g).scatter_add_(0, src[arg], g)
        if ctx.has_edge_attr and ctx.needs_input_grad[1]:
            grad_e = g.new_zeros(ctx.num_edges, g.size(1)).scatter_add_(0, arg, g)
        return grad_x, grad_e, None, None, None


def _segment_max(msg: Tensor, ptr: Tensor, num_nodes: int) -> Tuple[Tensor, Tensor]:
    """Max over the CSR segments of ``msg`` and the (first) argmax; empty -> index E."""
    num_edges = msg.size(0)
    if torch_geometric.typing.WITH_TORCH_SCATTER and (not msg.is_cuda or _scatter_has_cuda()):
        import torch_scatter

        out, arg = torch_scatter.segment_max_csr(msg, ptr)
        return out, arg
    counts = ptr.diff()
    dst = torch.repeat_interleave(torch.arange(num_nodes, device=msg.device), counts)
    index = dst.view(-1, 1).expand_as(msg)
    out = msg.new_zeros(num_nodes, msg.size(1)).scatter_reduce_(0, index, msg, "amax",
                                                                include_self=False)
    edge_ids = torch.arange(num_edges, device=msg.device).view(-1, 1).expand_as(msg)
    candidate = torch.where(msg == out.index_select(0, dst), edge_ids, num_edges)
    arg = torch.full_like(out, num_edges, dtype=torch.long).scatter_reduce_(
        0, index, candidate, "amin", include_self=True)
    return out, arg


def _scatter_has_cuda() -> bool:
    """Whether the installed torch-scatter was built with CUDA kernels."""
    try:
        return torch.ops.torch_scatter.cuda_version() != -1
    except (AttributeError, RuntimeError):
        return False


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
    src, ptr, perm = _csc(edge_index, x.size(0))
    if edge_attr is not None and perm is not None:
        edge_attr = edge_attr.index_select(0, perm)
    return GENMaxAggregate.apply(x, edge_attr, src, ptr, eps)


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
