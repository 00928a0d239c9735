r"""Fused GENConv message + aggregation (max; sum, mean, softmax) over destination-sorted edges.

PyG's GENConv with ``aggr='max'`` builds the messages
:math:`\mathbf{m}_{ji} = \mathrm{ReLU}(\mathbf{x}_j + \mathbf{e}_{ji}) + \epsilon`
through its generic message-passing path (index expansions, an
:math:`E \times C` message tensor plus an :math:`E \times C` ReLU mask kept
for backward, then ``scatter_reduce`` amax whose backward allocates several
more edge-sized temporaries). :func:`gen_max_aggregate` computes

.. math::
    \mathbf{h}_{i,c} = \max_{j \in \mathcal{N}(i)} \mathrm{ReLU}(\mathbf{x}_{j,c}
    + \mathbf{e}_{ji,c}) + \epsilon

as one operator, ``torch.ops.revgnn.gen_max`` (:mod:`revgnn.nn.ops`: ``torch.compile`` and
``torch.export`` see one op, autograd its registered backward), with two implementations of the
same outputs:

* **the C++ kernel** (:mod:`revgnn.nn.kernels`, CPU, float32/float64): one
  pass over the destination-sorted (CSC) edges that forms each message in
  registers and keeps only the running maximum. With the edge term in factored
  form :math:`\mathbf{e}_{ji} = \mathbf{W}\mathbf{a}_{ji} + \mathbf{b}`
  (a :class:`~revgnn.nn.edge_features.LinearEdgeFeatures` on the raw
  :math:`d`-dimensional features, :math:`d = 8` on proteins) no
  :math:`E \times C` tensor is ever written, in forward or backward;
* **PyTorch** (GPU, other dtypes, or no compiler): the messages are formed
  once (an :math:`E \times C` temporary) and aggregated with native
  ``scatter_reduce`` amax.

Both keep the winning edge per (node, channel) (int32, :math:`N \times C`)
and a tie flag per node, nothing edge-sized, so backward costs
:math:`O(NCd)` rather than :math:`O(EC)`; both add the floor :math:`\epsilon`
to the :math:`N \times C` result (equal: rounding is monotone), split the
gradient evenly among tied maxima exactly as ``scatter_reduce`` amax does in
PyG's CPU path (ties are judged before :math:`\epsilon` is added), and
aggregate nodes without incoming edges to 0, as PyG. (torch-scatter's
``segment_max_csr`` returns an argmax too, but is much slower than native
``scatter_reduce`` on CPU: ``docs/bench/in_code.md``.)

GENConv's sum, mean and softmax aggregations (PyG's ``SoftmaxAggregation`` with one temperature
:math:`t`, learnable or not) run through :func:`gen_aggregate` (``torch.ops.revgnn.gen_aggr``),
which keeps no :math:`E \times C` tensor in any implementation: forward keeps, for softmax, the
per-(node, channel) maximum of :math:`t\,\mathbf{m}` and the denominator, and backward streams the
edges again, recomputing each message and softmax weight. PyG's path keeps the messages, the
weights and their products: a reversible block's forward + backward raised peak memory by about
10 :math:`E \times C` float32 tensors with a learnable-temperature softmax, 5 with mean (issue #33).
"""

from __future__ import annotations

from typing import Optional, Union

import torch
from torch import Tensor
from torch_geometric.nn.aggr import MaxAggregation, MeanAggregation, SoftmaxAggregation, SumAggregation

from revgnn.nn import ops
from revgnn.nn.dispatch import reads_source_order
from revgnn.nn.edge_features import LinearEdgeFeatures
from revgnn.nn.graph_input import SortedEdges, csc, pyg_edge_index, segments, sort_edges
from revgnn.nn.norm_act import sequential_forward
from revgnn.utils.functional import transforms_active

EdgeTerm = Union[Tensor, LinearEdgeFeatures, None]


def gen_max_reference(
    x: Tensor, src: Tensor, dst: Tensor, ptr: Tensor, edge_term: Optional[Tensor], eps: float = 1e-7
) -> Tensor:
    """The same aggregation in plain differentiable PyTorch ops (an :math:`E \\times C` message
    tensor, ``scatter_reduce`` amax, whose gradient splits ties evenly): what runs under
    :mod:`torch.func` transforms, and the reference the kernels are tested against. ``src``/``dst``
    per edge, ``ptr`` the CSC pointer, ``edge_term`` ``[E, C]`` or None."""
    msg = x.index_select(0, src)
    msg = (msg + edge_term if edge_term is not None else msg).relu()
    index = dst.view(-1, 1).expand_as(msg)
    out = msg.new_zeros(ptr.numel() - 1, x.size(1)).scatter_reduce(0, index, msg, "amax", include_self=False)
    return (out + eps).masked_fill((ptr.diff() == 0).view(-1, 1), 0.0)


def _edge_term(x: Tensor, edge_attr: EdgeTerm):
    """``(attr, weight, bias)`` of an edge term: factored, dense (no weight) or absent."""
    if isinstance(edge_attr, LinearEdgeFeatures):
        if edge_attr.channels != x.size(1):
            raise ValueError(f"edge features map to {edge_attr.channels} channels but x has {x.size(1)}")
        return edge_attr.raw, edge_attr.weight, edge_attr.bias
    if edge_attr is not None and tuple(edge_attr.shape) != (edge_attr.size(0), x.size(1)):
        raise ValueError(
            f"dense edge terms must be [E, {x.size(1)}] (x's channels), got {list(edge_attr.shape)}"
        )
    return edge_attr, None, None


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
    attr, weight, bias = _edge_term(x, edge_attr)
    src, dst, ptr, attr = csc(edge_index, attr, x.size(0))
    if transforms_active():  # torch.func: the plain ops, which it can differentiate and batch
        if weight is not None:
            attr = LinearEdgeFeatures(attr, weight, bias).materialize()
        return gen_max_reference(x, src, dst, ptr, attr, eps)
    # one dtype throughout (autocast may leave x in bfloat16 and the edge terms in float32): the edge
    # terms are cast to x's, differentiably, as adding them to x's messages would
    attr, weight, bias = (t.to(x.dtype) if t is not None else None for t in (attr, weight, bias))
    contiguous = (t.contiguous() if t is not None else None for t in (attr, weight, bias))
    out, _, _ = ops.gen_max(
        x.contiguous(), ptr.long().contiguous(), src.long().contiguous(), *contiguous, eps
    )
    return out


def gen_aggregate(
    x: Tensor,
    edge_index: Tensor,
    edge_attr: EdgeTerm = None,
    eps: float = 1e-7,
    reduce: str = "sum",
    t: Union[Tensor, float, None] = None,
) -> Tensor:
    r"""GENConv's sum, mean and softmax aggregations without an :math:`E \times C` tensor
    (``torch.ops.revgnn.gen_aggr``):

    .. math::
        \mathbf{m}_{ji} = \mathrm{ReLU}(\mathbf{x}_j + \mathbf{e}_{ji}) + \epsilon, \qquad
        \mathbf{h}_i = \sum_{j} \mathbf{m}_{ji}, \quad
        \frac{1}{|\mathcal{N}(i)|} \sum_{j} \mathbf{m}_{ji} \quad\text{or}\quad
        \sum_{j} \mathrm{softmax}_j(t\,\mathbf{m}_{ji}) \odot \mathbf{m}_{ji}

    (the softmax per channel, :math:`t` learnable), 0 for nodes without in-edges, as PyG's
    ``GENConv`` with ``aggr='sum'``, ``'mean'`` or ``'softmax'``. Forward keeps per node only the
    softmax's running maximum and denominator; backward recomputes every message and weight from
    them, :math:`\partial L/\partial m_{jic} = g_{ic}\,\alpha_{jic}(1 + t(m_{jic} - h_{ic}))` and
    :math:`\partial L/\partial t = \sum g_{ic}\,\alpha_{jic}\,m_{jic}(m_{jic} - h_{ic})`.

    Args:
        x (torch.Tensor): Node features ``[N, C]``.
        edge_index (torch.Tensor or torch_geometric.EdgeIndex): ``[2, E]``, source in row 0,
            destination in row 1 (any form :func:`~revgnn.nn.graph_input.sort_edges` takes). A
            destination-sorted ``EdgeIndex`` keeps its sorted forms across layers.
        edge_attr (torch.Tensor or LinearEdgeFeatures, optional): Edge terms ``[E, C]`` in the
            order of ``edge_index``, or the same in factored form, never expanded.
            (default: :obj:`None`)
        eps (float, optional): The message floor :math:`\epsilon`. (default: :obj:`1e-7`)
        reduce (str, optional): ``'sum'`` (or ``'add'``), ``'mean'`` or ``'softmax'``.
            (default: :obj:`'sum'`)
        t (torch.Tensor or float, optional): The softmax's inverse temperature, a float or a
            one-element tensor (learnable); softmax only. (default: :obj:`None`)
    """
    reduce = "sum" if reduce == "add" else reduce
    if reduce not in ("sum", "mean", "softmax"):
        raise ValueError(f"gen_aggregate: reduce must be 'sum', 'add', 'mean' or 'softmax', got {reduce!r}")
    if (reduce == "softmax") != (t is not None):
        raise ValueError("gen_aggregate: a temperature t is given for, and only for, reduce='softmax'")
    attr, weight, bias = _edge_term(x, edge_attr)
    edge_index, attr = sort_edges(edge_index, attr, x.size(0))
    if not isinstance(t, Tensor) and t is not None:
        t = x.new_tensor([float(t)])
    # one dtype throughout (autocast may leave x in bfloat16 and the edge terms in float32)
    attr, weight, bias, t = (
        v.to(x.dtype).contiguous() if v is not None else None for v in (attr, weight, bias, t)
    )
    # the source order (two [E] int64 arrays and a sort; an EdgeIndex caches it) only for a backward
    # that reads it: the Triton kernel's, not the C++ or PyTorch one, which walk the destination order.
    # A compiled graph keeps it (the choice reads the environment and the built kernels, which
    # torch.compile would trace or break on)
    num_edges = (edge_index.edge_index if isinstance(edge_index, SortedEdges) else edge_index).size(1)
    read = torch.compiler.is_compiling() or reads_source_order(
        "gen_aggr", x, attr, weight, bias, t, num_edges=num_edges
    )
    graph = segments(edge_index, x.size(0), read)
    index = (graph.ptr, graph.src, graph.dst, graph.sptr, graph.sdst, graph.sperm)  # int64, contiguous
    out, _, _ = ops.gen_aggr(
        x.contiguous(), *index, attr, weight, bias, t.view(1) if t is not None else None, eps, reduce
    )
    return out


def fused_reduce(conv) -> Optional[str]:
    """The reduction of a GENConv's aggregation that the fused operators compute as PyG does
    (``'max'``, ``'sum'``, ``'mean'``, ``'softmax'``), or :obj:`None` (powermean, a softmax with a
    per-channel temperature or ``semi_grad``, a multi-aggregation: PyG's path)."""
    aggr = getattr(conv, "aggr_module", None)
    if isinstance(aggr, MaxAggregation):
        return "max"
    if isinstance(aggr, SumAggregation):
        return "sum"
    if isinstance(aggr, MeanAggregation):
        return "mean"
    if isinstance(aggr, SoftmaxAggregation) and aggr.channels == 1 and (aggr.learn or not aggr.semi_grad):
        return "softmax"
    return None


def gen_conv(conv, x: Tensor, edge_index, edge_attr: Optional[Tensor] = None) -> Tensor:
    """``conv(x, edge_index, edge_attr)`` for a PyG ``GENConv``, through
    :func:`gen_max_aggregate` (max) or :func:`gen_aggregate` (sum, mean, softmax) when that
    computes the same function.

    The fused path applies to those aggregations with equal in/out channels and no
    message norm or internal edge encoder (edge features already encoded,
    possibly in factored form), the softmax with PyG's default one temperature for all channels
    (learnable or not) and without ``semi_grad``; anything else (powermean among them), a
    non-tensor graph (``SparseTensor``, a distributed ``SARGraph``), or sum/mean/softmax under
    :mod:`torch.func` transforms, calls the conv itself, with
    factored edge features expanded unless the conv takes them as they are
    (``takes_factored_edges``: the SAR GENConv, whose max aggregation runs the
    kernel shard by shard). The conv's modules stay the parameters' holders either way (same
    ``state_dict``).
    """
    plain = not any(
        hasattr(conv, name) for name in ("lin_src", "lin_dst", "lin_edge", "lin_aggr_out", "msg_norm")
    )
    graph = isinstance(edge_index, (Tensor, SortedEdges))
    reduce = fused_reduce(conv) if plain and graph and isinstance(x, Tensor) else None
    if reduce == "max":
        return sequential_forward(conv.mlp, gen_max_aggregate(x, edge_index, edge_attr, conv.eps) + x)
    if reduce is not None and not transforms_active():  # torch.func: PyG's differentiable ops
        t = conv.aggr_module.t if reduce == "softmax" else None
        h = gen_aggregate(x, edge_index, edge_attr, conv.eps, reduce, t)
        return sequential_forward(conv.mlp, h + x)
    if isinstance(edge_attr, LinearEdgeFeatures) and not getattr(conv, "takes_factored_edges", False):
        edge_attr = edge_attr.materialize()
    return conv(x, pyg_edge_index(edge_index), edge_attr)
