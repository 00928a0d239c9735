r"""Fused GENConv message + max aggregation over destination-sorted edges.

PyG's GENConv with ``aggr='max'`` builds the messages
:math:`\mathbf{m}_{ji} = \mathrm{ReLU}(\mathbf{x}_j + \mathbf{e}_{ji}) + \epsilon`
through its generic message-passing path (index expansions, an
:math:`E \times C` message tensor plus an :math:`E \times C` ReLU mask kept
for backward, then ``scatter_reduce`` amax whose backward allocates several
more edge-sized temporaries). :func:`gen_max_aggregate` computes

.. math::
    \mathbf{h}_{i,c} = \max_{j \in \mathcal{N}(i)} \mathrm{ReLU}(\mathbf{x}_{j,c}
    + \mathbf{e}_{ji,c}) + \epsilon

with one of two implementations:

* **the C++ kernel** (:mod:`revgnn.nn.kernels`, CPU, float32/float64): one
  pass over the destination-sorted (CSC) edges that forms each message in
  registers and keeps only the running maximum. With the edge term in factored
  form :math:`\mathbf{e}_{ji} = \mathbf{W}\mathbf{a}_{ji} + \mathbf{b}`
  (a :class:`~revgnn.nn.edge_features.LinearEdgeFeatures` on the raw
  :math:`d`-dimensional features, :math:`d = 8` on proteins) no
  :math:`E \times C` tensor is ever written, in forward or backward. Forward
  keeps the winning edge per (node, channel) (int32, :math:`N \times C`), so
  backward costs :math:`O(NCd)` rather than :math:`O(EC)`;
* **the PyTorch path** (GPU, other dtypes, or no compiler): the message buffer
  is written once (gather, add, in-place ReLU), aggregated with native
  ``scatter_reduce`` amax, and the ReLU'd messages are the one
  :math:`E \times C` tensor kept for backward.

Both add the floor :math:`\epsilon` to the :math:`N \times C` result (equal:
rounding is monotone), split the gradient evenly among tied maxima exactly as
``scatter_reduce`` amax does in PyG's CPU path (ties are judged before
:math:`\epsilon` is added), and aggregate nodes without incoming edges to 0,
as PyG. (torch-scatter's ``segment_max_csr`` returns an argmax too, but is
much slower than native ``scatter_reduce`` on CPU: ``docs/bench/in_code.md``.)
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable
from torch_geometric import EdgeIndex

from revgnn.nn.edge_features import LinearEdgeFeatures
from revgnn.nn.norm_act import sequential_forward


def sort_edges(edge_index, edge_attr: Optional[Tensor], num_nodes: int):
    """Destination-sorted :class:`torch_geometric.EdgeIndex` (and edge features in that order).

    Sorting once per forward pass lets every layer aggregate over contiguous
    segments (CSR) instead of sorting or scattering in each of hundreds of
    layers. A destination-sorted ``EdgeIndex`` is returned unchanged, and so is
    a graph that is not a tensor (a ``SparseTensor``, a distributed ``SARGraph``).
    """
    if not isinstance(edge_index, Tensor):
        return edge_index, edge_attr
    if isinstance(edge_index, EdgeIndex) and edge_index.is_sorted_by_col:
        return edge_index, edge_attr
    if not isinstance(edge_index, EdgeIndex):
        edge_index = EdgeIndex(edge_index.contiguous(), sparse_size=(num_nodes, num_nodes))
    edge_index, perm = edge_index.sort_by("col")
    if edge_attr is not None and perm is not None:
        edge_attr = edge_attr.index_select(0, perm)
    return edge_index, edge_attr


def _csc(
    edge_index: Tensor, edge_attr: Optional[Tensor], num_nodes: int
) -> Tuple[Tensor, Tensor, Tensor, Optional[Tensor]]:
    """(source, destination) per edge in destination order, the CSC pointer ``[N + 1]``, and
    the edge features in that order."""
    edge_index, edge_attr = sort_edges(edge_index, edge_attr, num_nodes)
    (colptr, _), _ = edge_index.get_csc()
    plain = edge_index.as_tensor()
    return plain[0], plain[1], colptr, edge_attr


def _kernel():
    """The compiled module or None; imported here, not at the top, so that ``python -m
    revgnn.nn.kernels`` (the build command) does not find itself already imported."""
    from revgnn.nn import kernels

    return kernels.gen_max()


class FusedGENMax(torch.autograd.Function):
    """The C++ kernel (:mod:`revgnn.nn.kernels`) as an autograd function.

    ``attr`` is None, dense ``[E, C]``, or the raw ``[E, d]`` features when
    ``weight`` ``[C, d]`` (and optionally ``bias`` ``[C]``) is given.
    """

    @staticmethod
    def forward(
        ctx,
        x: Tensor,
        attr: Optional[Tensor],
        weight: Optional[Tensor],
        bias: Optional[Tensor],
        ptr: Tensor,
        src: Tensor,
        eps: float,
    ) -> Tensor:  # type: ignore[override]
        x = x.contiguous()
        ptr, src = ptr.long().contiguous(), src.long().contiguous()  # int32 / strided indices too
        attr = attr.contiguous() if attr is not None else None
        wt = weight.t().contiguous() if weight is not None else None
        bias = bias.contiguous() if bias is not None else None
        out, arg, tied = _kernel().forward(x, ptr, src, attr, wt, bias, eps)
        ctx.save_for_backward(x, attr, wt, bias, ptr, src, arg, tied)
        return out

    @staticmethod
    @once_differentiable  # a double backward through it raises rather than silently giving 0
    def backward(ctx, grad_out: Tensor):  # type: ignore[override]
        x, attr, wt, bias, ptr, src, arg, tied = ctx.saved_tensors
        need_x, need_attr, need_w, need_b = ctx.needs_input_grad[:4]
        gx, ga, gw, gb = _kernel().backward(
            grad_out.contiguous(), arg, tied, x, ptr, src, attr, wt, bias, need_x, need_attr, need_w, need_b
        )
        grad_x = gx if need_x else None
        grad_w = gw if need_w and wt is not None else None
        grad_b = gb if need_b and bias is not None else None
        grad_attr = ga if need_attr and attr is not None else None
        return grad_x, grad_attr, grad_w, grad_b, None, None, None


class GENMaxAggregate(torch.autograd.Function):
    """``max_j relu(x[src_j] + e_j) + eps`` per destination; see the module docstring."""

    @staticmethod
    def forward(
        ctx, x: Tensor, edge_attr: Optional[Tensor], src: Tensor, dst: Tensor, degree: Tensor, eps: float
    ) -> Tensor:  # type: ignore[override]
        msg = x.index_select(0, src)  # a fresh E x C buffer: updated in place below
        if edge_attr is not None:
            msg.add_(edge_attr)
        msg.clamp_min_(0.0)
        index = dst.view(-1, 1).expand_as(msg)
        out = msg.new_zeros(degree.numel(), msg.size(1)).scatter_reduce_(
            0, index, msg, "amax", include_self=False
        )
        ctx.save_for_backward(msg, out, src, dst)
        ctx.has_edge_attr = edge_attr is not None
        result = out + eps
        return result.masked_fill_((degree == 0).view(-1, 1), 0.0)

    @staticmethod
    def backward(ctx, grad_out: Tensor):  # type: ignore[override]
        msg, out, src, dst = ctx.saved_tensors
        index = dst.view(-1, 1).expand_as(msg)
        winner = msg == out.index_select(0, dst)  # argmax mask (ties included)
        ties = out.new_zeros(out.shape).scatter_add_(0, index, winner.to(out.dtype))
        grad_msg = (grad_out / ties.clamp_min(1.0)).index_select(0, dst)
        grad_msg.mul_(winner & (msg > 0))  # max, then ReLU
        grad_x = grad_e = None
        if ctx.needs_input_grad[0]:
            grad_x = torch.zeros_like(grad_out).index_add_(0, src, grad_msg)
        if ctx.has_edge_attr and ctx.needs_input_grad[1]:
            grad_e = grad_msg
        return grad_x, grad_e, None, None, None, None


def _kernel_applies(x: Tensor, tensors, num_edges: int) -> bool:
    """CPU, float32/64 throughout, built, and fewer than 2^31 edges (the kernel keeps the
    winning edge's offset within its node's segment as an int32)."""
    return (
        x.device.type == "cpu"
        and x.dtype in (torch.float32, torch.float64)
        and x.dim() == 2
        and all(t is None or (t.dtype == x.dtype and t.device == x.device) for t in tensors)
        and num_edges < 2**31
        and _kernel() is not None
    )


EdgeTerm = Union[Tensor, LinearEdgeFeatures, None]


def gen_max_aggregate(x: Tensor, edge_index: Tensor, edge_attr: EdgeTerm = None, eps: float = 1e-7) -> Tensor:
    r"""Fused :math:`\max_{j \in \mathcal{N}(i)} \mathrm{ReLU}(\mathbf{x}_j +
    \mathbf{e}_{ji}) + \epsilon` (GENConv's max aggregation).

    Args:
        x (torch.Tensor): Node features ``[N, C]``.
        edge_index (torch.Tensor or torch_geometric.EdgeIndex): ``[2, E]``,
            source in row 0, destination in row 1. A destination-sorted
            ``EdgeIndex`` avoids a sort per call.
        edge_attr (torch.Tensor or LinearEdgeFeatures, optional): Edge terms
            ``[E, C]`` in the order of ``edge_index``, or the same in factored
            form (raw ``[E, d]`` features with a ``C x d`` map), which the C++
            kernel never expands.
        eps (float, optional): The message floor :math:`\epsilon`.
    """
    if isinstance(edge_attr, LinearEdgeFeatures):
        if edge_attr.channels != x.size(1):
            raise ValueError(f"edge features map to {edge_attr.channels} channels but x has {x.size(1)}")
        attr, weight, bias = edge_attr.raw, edge_attr.weight, edge_attr.bias
    else:
        attr, weight, bias = edge_attr, None, None
    src, dst, ptr, attr = _csc(edge_index, attr, x.size(0))
    if _kernel_applies(x, (attr, weight, bias), src.numel()):
        return FusedGENMax.apply(x, attr, weight, bias, ptr, src, eps)
    if weight is not None:
        attr = LinearEdgeFeatures(attr, weight, bias).materialize()
    return GENMaxAggregate.apply(x, attr, src, dst, ptr.diff(), eps)


def gen_conv(conv, x: Tensor, edge_index, edge_attr: Optional[Tensor] = None) -> Tensor:
    """``conv(x, edge_index, edge_attr)`` for a PyG ``GENConv``, through
    :func:`gen_max_aggregate` when that computes the same function.

    The fused path applies to max aggregation with equal in/out channels and no
    message norm or internal edge encoder (edge features already encoded,
    possibly in factored form); anything else, or a non-tensor graph
    (``SparseTensor``, a distributed ``SARGraph``), calls the conv itself, with
    factored edge features expanded unless the conv takes them as they are
    (``takes_factored_edges``: the SAR GENConv, whose max aggregation runs the
    kernel shard by shard).
    """
    plain = not any(
        hasattr(conv, name) for name in ("lin_src", "lin_dst", "lin_edge", "lin_aggr_out", "msg_norm")
    )
    if conv.aggr == "max" and plain and isinstance(edge_index, Tensor) and isinstance(x, Tensor):
        return sequential_forward(conv.mlp, gen_max_aggregate(x, edge_index, edge_attr, conv.eps) + x)
    if isinstance(edge_attr, LinearEdgeFeatures) and not getattr(conv, "takes_factored_edges", False):
        edge_attr = edge_attr.materialize()
    return conv(x, edge_index, edge_attr)
