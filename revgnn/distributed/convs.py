r"""SAR-aware versions of PyG convolutions: the SAR forms of the built-in convs.

Each class subclasses the PyG conv without adding parameters, so a
single-process model's ``state_dict`` loads unchanged and parameter
gradients compare elementwise. ``forward`` takes the SAR path when
``edge_index`` is a :class:`~revgnn.distributed.sar.SARGraph` and defers to
PyG otherwise. A conv's registration names its SAR form
(:func:`~revgnn.nn.conv_registry.register_conv`'s ``sar=``: the built-in blocks
name the classes here); :func:`convert_to_sar` reads them from the registry
and switches the convs of an existing model (e.g. a RevGNN built from
:mod:`revgnn.nn.blocks`) in place.

On the SAR path ``x`` holds the worker's local nodes and ``edge_attr`` its
local edges in the graph's shard order (``graph.edge_attr``, or an encoding
of it). Node-wise pre-/post-ops (linear maps, the GENConv MLP, biases) run
locally; only the edge aggregation goes through the ring.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Type

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.nn import GATConv, GCNConv, GENConv, GINConv, SAGEConv
from torch_geometric.nn.aggr import MaxAggregation, MeanAggregation, SoftmaxAggregation, SumAggregation
from torch_geometric.nn.conv import MessagePassing

from revgnn.nn.edge_features import LinearEdgeFeatures
from revgnn.nn.gat import draw_seed, edge_logit_term, self_loop_term
from revgnn.nn.gen_max import fused_reduce
from revgnn.nn.norm_act import sequential_forward

from .aggregate_sar import sar_aggregate
from .comm import AllReduceSum
from .gat_sar import sar_gat_attention, shard_form_applies
from .gen_aggr_sar import sar_gen_aggregate
from .gen_max_sar import sar_gen_max
from .sar import EdgeOp, SARGraph, sequential_aggregate

__all__ = [
    "SARGENConv",
    "SARGATConv",
    "SARSAGEConv",
    "SARGINConv",
    "SARGCNConv",
    "gcn_edge_weight",
    "SARBatchNorm",
    "convert_to_sar",
    "sar_forms",
    "sar_unsupported",
]


def sar_forms() -> Dict[Type[MessagePassing], Type[MessagePassing]]:
    """PyG conv class -> its SAR form, for every registered conv that names one (``sar=`` of
    :func:`~revgnn.nn.conv_registry.register_conv`). A SAR form subclasses exactly one PyG conv;
    two convs naming different forms of the same PyG conv are an error (which would
    :func:`convert_to_sar` pick?)."""
    from revgnn.nn import CONVS

    forms: Dict[Type[MessagePassing], Type[MessagePassing]] = {}
    for spec in CONVS.values():
        form = spec.sar_form()
        if form is None:
            continue
        bases = [b for b in getattr(form, "__bases__", ()) if issubclass(b, MessagePassing)]
        if len(bases) != 1:
            raise TypeError(
                f"conv {spec.name!r}: its SAR form {form!r} must subclass exactly one PyG conv "
                f"(a MessagePassing class), got bases {getattr(form, '__bases__', ())}"
            )
        if forms.setdefault(bases[0], form) is not form:
            raise ValueError(
                f"conv {spec.name!r} names {form.__name__} as the SAR form of {bases[0].__name__}, "
                f"which another conv gives as {forms[bases[0]].__name__}"
            )
    return forms


def _simple_aggr_kind(module, name: str) -> str:
    aggr = module.aggr_module
    for cls, kind in ((SumAggregation, "sum"), (MeanAggregation, "mean"), (MaxAggregation, "max")):
        if type(aggr) is cls:
            return kind
    raise NotImplementedError(
        f"{name} with aggregation {aggr} is not supported under SAR "
        "(supported: sum, mean, max" + (", softmax" if name == "GENConv" else "") + ")"
    )


def _no_tuple(x, name):
    if not isinstance(x, Tensor):
        raise NotImplementedError(
            f"{name} on a SARGraph takes one node tensor (bipartite input is not supported)"
        )


def _check_no_batch_norm(module: torch.nn.Module, name: str):
    if module.training and any(
        isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and not isinstance(m, SARBatchNorm)
        for m in module.modules()
    ):
        raise NotImplementedError(
            f"{name} holds BatchNorm, whose training statistics span all "
            "nodes of all workers; run convert_to_sar(model), which makes "
            "it a SARBatchNorm"
        )


class _GENMessage(EdgeOp):
    r""":math:`\phi_{ji} = \mathrm{ReLU}(\mathbf{x}_j + W_e\mathbf{e}_{ji}
    + \mathbf{b}_e) + \epsilon`; for softmax the score is
    :math:`t\,\phi_{ji}`."""

    def __init__(self, conv: GENConv, kind: str, has_edge: bool):
        self.kind = kind
        self.eps = conv.eps
        self.lin_edge = getattr(conv, "lin_edge", None) if has_edge else None
        self.t = None
        if kind == "softmax":
            aggr = conv.aggr_module
            self.t = aggr.t
            self.channels = aggr.channels
            self.detach_score = (not aggr.learn) and aggr.semi_grad

    def params(self) -> List[Tensor]:
        ps = []
        if self.lin_edge is not None:
            ps.append(self.lin_edge.weight)
            if self.lin_edge.bias is not None:
                ps.append(self.lin_edge.bias)
        if isinstance(self.t, Tensor):
            ps.append(self.t)
        return ps

    def message(self, x_j, x_i, edge, params: Sequence[Tensor]):
        params = list(params)
        if self.lin_edge is not None:
            w = params.pop(0)
            b = params.pop(0) if self.lin_edge.bias is not None else None
            edge = F.linear(edge, w, b)
        msg = x_j if edge is None else x_j + edge
        v = msg.relu() + self.eps
        if self.kind != "softmax":
            return None, v
        t = params.pop(0) if isinstance(self.t, Tensor) else self.t
        if isinstance(t, Tensor) and self.channels != 1:
            t = t.view(-1, self.channels)
        s = v if (not isinstance(t, Tensor) and t == 1) else v * t
        return s, v


class SARGENConv(GENConv):
    r""":class:`torch_geometric.nn.GENConv` that also runs on a
    :class:`~revgnn.distributed.sar.SARGraph` (aggregations sum, mean,
    max, softmax; ``msg_norm`` supported).

    ``edge_attr`` may also be a
    :class:`~revgnn.nn.edge_features.LinearEdgeFeatures` (the factored
    encoding :class:`~revgnn.nn.GENBlock` hands over). Max aggregation then
    runs through the fused kernel shard by shard
    (:mod:`revgnn.distributed.gen_max_sar`), and sum, mean and softmax (one
    temperature, learnable or not, without ``semi_grad``) through
    ``torch.ops.revgnn.gen_aggr`` shard by shard
    (:mod:`revgnn.distributed.gen_aggr_sar`), on the raw features and the
    composed map, without an :math:`E \times C` tensor; elsewhere (powermean,
    a per-channel temperature, ``softmax_sg``; max without a kernel) the
    features are expanded and the PyTorch path of
    :func:`~revgnn.distributed.sar.sequential_aggregate` runs."""

    #: :func:`revgnn.nn.gen_max.gen_conv` passes factored edge features through.
    takes_factored_edges = True

    def forward(self, x, edge_index, edge_attr: Optional[Tensor] = None, size=None):
        if not isinstance(edge_index, SARGraph):
            if isinstance(edge_attr, LinearEdgeFeatures):
                edge_attr = edge_attr.materialize()
            return super().forward(x, edge_index, edge_attr, size)
        _no_tuple(x, "GENConv")
        _check_no_batch_norm(self.mlp, "GENConv")
        graph = edge_index
        if isinstance(self.aggr_module, SoftmaxAggregation):
            kind = "softmax"
        else:
            kind = _simple_aggr_kind(self, "GENConv")
        x_src = self.lin_src(x) if hasattr(self, "lin_src") else x
        rows = edge_attr.raw if isinstance(edge_attr, LinearEdgeFeatures) else edge_attr
        if rows is not None and rows.size(0) != graph.num_edges:
            raise ValueError("edge_attr must hold the local edges in shard order (graph.edge_attr)")
        out = None
        lin_edge = getattr(self, "lin_edge", None)
        if kind == "max":
            out = sar_gen_max(graph, x_src, edge_attr, lin_edge, self.eps)
        elif fused_reduce(self) is not None and (rows is None or rows.dim() == 2):
            t = self.aggr_module.t if kind == "softmax" else None
            out = sar_gen_aggregate(graph, x_src, edge_attr, lin_edge, self.eps, kind, t)
        fused = out is not None
        if not fused:
            if isinstance(edge_attr, LinearEdgeFeatures):
                edge_attr = edge_attr.materialize()
            op = _GENMessage(self, kind, edge_attr is not None)
            out = sequential_aggregate(op, graph, x_src, None, edge_attr)
        if hasattr(self, "lin_aggr_out"):
            out = self.lin_aggr_out(out)
        if hasattr(self, "msg_norm"):
            out = self.msg_norm(x, out)
        x_dst = self.lin_dst(x) if hasattr(self, "lin_dst") else x
        if fused:  # as the one-process kernel path (revgnn.nn.gen_max.gen_conv)
            return sequential_forward(self.mlp, out + x_dst)
        return self.mlp(out + x_dst)


class _GATMessage(EdgeOp):
    r"""Score :math:`s_{ji} = \mathrm{LeakyReLU}(\alpha^{src}_j +
    \alpha^{dst}_i + \langle \mathbf{a}_e, W_e \mathbf{e}_{ji}\rangle)` per
    head; value :math:`W\mathbf{x}_j`. The fetched block is
    :math:`[W\mathbf{x}_j \,\|\, \alpha^{src}_j]` so one transfer carries
    both."""

    kind = "softmax"

    def __init__(self, conv: GATConv, has_edge: bool):
        self.H, self.C = conv.heads, conv.out_channels
        self.slope = conv.negative_slope
        self.lin_edge = conv.lin_edge if has_edge else None
        self.att_edge = conv.att_edge if has_edge else None

    def params(self):
        if self.lin_edge is None:
            return []
        ps = [self.lin_edge.weight]
        if self.lin_edge.bias is not None:
            ps.append(self.lin_edge.bias)
        return ps + [self.att_edge]

    def message(self, x_j, x_i, edge, params):
        H, C = self.H, self.C
        v = x_j[:, : H * C].view(-1, H, C)
        s = x_j[:, H * C :] + x_i
        if self.lin_edge is not None:
            params = list(params)
            w = params.pop(0)
            b = params.pop(0) if self.lin_edge.bias is not None else None
            att = params.pop(0)
            if edge.dim() == 1:
                edge = edge.view(-1, 1)
            e = F.linear(edge, w, b).view(-1, H, C)
            s = s + (e * att).sum(dim=-1)
        return F.leaky_relu(s, self.slope), v


class SARGATConv(GATConv):
    r""":class:`torch_geometric.nn.GATConv` that also runs on a
    :class:`~revgnn.distributed.sar.SARGraph`, with online softmax and
    attention rematerialisation.

    With PyG's self loops (``fill_value='mean'`` where edge features are used) and a positive
    ``negative_slope`` the attention runs through the fused operator shard by shard
    (:mod:`revgnn.distributed.gat_sar`), without an :math:`E \times` heads :math:`\times C` tensor,
    edge features (a tensor or a :class:`~revgnn.nn.edge_features.LinearEdgeFeatures`) kept
    factored, attention dropout drawn as :func:`revgnn.nn.gat.gat_conv` draws it in one process
    (one seed per call from torch's generator, the mask keyed by the edges' global ids);
    otherwise through the PyTorch path of :func:`~revgnn.distributed.sar.sequential_aggregate`,
    which takes no attention dropout in training."""

    #: :func:`revgnn.nn.gat.gat_conv` passes factored edge features through.
    takes_factored_edges = True

    def forward(
        self, x, edge_index, edge_attr: Optional[Tensor] = None, size=None, return_attention_weights=None
    ):
        if not isinstance(edge_index, SARGraph):
            return super().forward(x, edge_index, edge_attr, size, return_attention_weights)
        _no_tuple(x, "GATConv")
        if return_attention_weights:
            raise NotImplementedError(
                "return_attention_weights would materialise an E x heads tensor, which SAR exists to avoid"
            )
        graph = edge_index
        p = self.dropout if self.training else 0.0
        H, C = self.heads, self.out_channels
        res = self.res(x) if self.res is not None else None
        if self.lin is not None:
            xs = xd = self.lin(x).view(-1, H, C)
        else:
            xs = self.lin_src(x).view(-1, H, C)
            xd = self.lin_dst(x).view(-1, H, C)
        a_src = (xs * self.att_src).sum(dim=-1)
        a_dst = (xd * self.att_dst).sum(dim=-1)
        rows = edge_attr.raw if isinstance(edge_attr, LinearEdgeFeatures) else edge_attr
        if rows is not None and rows.size(0) != graph.num_edges:
            raise ValueError("edge_attr must hold the local edges in shard order (graph.edge_attr)")
        loops = self.add_self_loops and (self.fill_value == "mean" or rows is None or self.lin_edge is None)
        if loops and shard_form_applies(self.negative_slope, xs.dtype):
            out = _gat_shard_form(self, graph, xs, a_src, a_dst, edge_attr, p)
        elif p > 0:
            raise NotImplementedError(
                "GATConv attention dropout under SAR needs the fused shard form: PyG's self loops "
                "(fill_value='mean' with edge features) and a positive negative_slope (or set dropout=0)"
            )
        else:
            if isinstance(edge_attr, LinearEdgeFeatures):
                edge_attr = edge_attr.materialize()
            out = self._generic(graph, xs, a_src, a_dst, edge_attr)
        out = out.reshape(-1, H * C) if self.concat else out.mean(dim=1)
        if res is not None:
            out = out + res
        if self.bias is not None:
            out = out + self.bias
        return out

    def _generic(self, graph, xs, a_src, a_dst, edge_attr):
        """The attention through :func:`~revgnn.distributed.sar.sequential_aggregate`'s PyTorch
        messages (options the shard form does not take: no or other self loops)."""
        H, C = self.heads, self.out_channels
        if self.add_self_loops:
            if edge_attr is not None:
                edge_attr = graph.self_loop_edge_attr(edge_attr, self.fill_value)
            graph = graph.with_self_loops()
        has_edge = edge_attr is not None and self.lin_edge is not None
        op = _GATMessage(self, has_edge)
        send = torch.cat([xs.reshape(-1, H * C), a_src], dim=1)
        return sequential_aggregate(op, graph, send, a_dst, edge_attr if has_edge else None)


def _gat_shard_form(conv: GATConv, graph: SARGraph, xs, a_src, a_dst, edge_attr, p: float) -> Tensor:
    """GATConv's attention (PyG's self loops, ``fill_value='mean'``) through the fused operator shard
    by shard (:mod:`revgnn.distributed.gat_sar`), the edge features factored as
    :func:`revgnn.nn.gat.gat_conv` takes them, attention dropout ``p`` with a seed drawn as there."""
    H, C = conv.heads, conv.out_channels
    raw, w, b = edge_logit_term(conv, edge_attr, H, C)
    if raw is None:
        loop = a_src.new_zeros(graph.num_local, H)
    else:
        is_loop = torch.zeros(graph.num_edges, dtype=torch.bool, device=graph.dst.device)
        lo, hi = graph.shard(graph.rank)  # only the own shard's sources are local nodes
        is_loop[lo:hi] = graph.src[lo:hi] == graph.dst[lo:hi]
        loop = self_loop_term(graph.dst, is_loop, raw, w, b, graph.num_local)
    seed = draw_seed() if p > 0 else None
    return sar_gat_attention(graph, xs, a_src, a_dst, loop, raw, w, b, conv.negative_slope, p, seed)


class SARSAGEConv(SAGEConv):
    r""":class:`torch_geometric.nn.SAGEConv` (sum/mean/max aggregation) that
    also runs on a :class:`~revgnn.distributed.sar.SARGraph`, aggregating shard by shard
    through the fused operators (:mod:`revgnn.distributed.aggregate_sar`): no
    :math:`E \times C` tensor; mean and sum take the no-re-fetch fast path."""

    def forward(self, x, edge_index, size=None):
        if not isinstance(edge_index, SARGraph):
            return super().forward(x, edge_index, size)
        _no_tuple(x, "SAGEConv")
        x_src = self.lin(x).relu() if (self.project and hasattr(self, "lin")) else x
        kind = _simple_aggr_kind(self, "SAGEConv")
        out = self.lin_l(sar_aggregate(edge_index, x_src, kind))
        if self.root_weight:
            out = out + self.lin_r(x)
        if self.normalize:
            out = F.normalize(out, p=2.0, dim=-1)
        return out


class SARGINConv(GINConv):
    r""":class:`torch_geometric.nn.GINConv` that also runs on a
    :class:`~revgnn.distributed.sar.SARGraph`:
    :math:`h_\Theta((1+\epsilon)\mathbf{x}_i + \sum_j \mathbf{x}_j)`, the sum
    through the fused operators (:mod:`revgnn.distributed.aggregate_sar`) on the
    no-re-fetch fast path."""

    def forward(self, x, edge_index, size=None):
        if not isinstance(edge_index, SARGraph):
            return super().forward(x, edge_index, size)
        _no_tuple(x, "GINConv")
        _check_no_batch_norm(self.nn, "GINConv")
        kind = _simple_aggr_kind(self, "GINConv")
        out = sar_aggregate(edge_index, x, kind)
        out = out + (1 + self.eps) * x
        return self.nn(out)


def gcn_edge_weight(graph: SARGraph, improved: bool = False) -> Tensor:
    r"""Symmetric GCN normalisation on the self-loop view of ``graph``:
    :math:`w_{ji} = \hat d_j^{-1/2} \hat d_i^{-1/2}` with :math:`\hat d` the
    in-degree including one self loop of weight 1 (2 if ``improved``),
    exactly PyG's ``gcn_norm`` for unweighted graphs. Source degrees come
    from their owners in one ring; cached on the graph."""
    view = graph.with_self_loops()
    key = "_gcn_norm_improved" if improved else "_gcn_norm"
    cached = getattr(view, key, None)
    if cached is not None:
        return cached
    n = view.num_local
    a, b = view.shard(view.rank)
    w = torch.ones(view.num_edges, dtype=torch.float64, device=view.dst.device)
    w[b - n : b] = 2.0 if improved else 1.0  # the loops close the local shard
    deg = w.new_zeros(n).index_add_(0, view.dst, w)
    dis = deg.pow(-0.5)
    dis[dis == float("inf")] = 0
    norm = torch.empty_like(w)
    with torch.no_grad():
        for q, block in view.ring(dis.view(-1, 1), "GCN degree exchange"):
            s0, s1 = view.shard(q)
            norm[s0:s1] = block.view(-1)[view.src[s0:s1]] * w[s0:s1] * dis[view.dst[s0:s1]]
    setattr(view, key, norm)
    return norm


class SARGCNConv(GCNConv):
    """:class:`torch_geometric.nn.GCNConv` (unweighted graph, self loops,
    symmetric normalisation) that also runs on a
    :class:`~revgnn.distributed.sar.SARGraph`: the weighted sum through the fused
    operators (:mod:`revgnn.distributed.aggregate_sar`) on the no-re-fetch fast
    path."""

    def forward(self, x, edge_index, edge_weight=None):
        if not isinstance(edge_index, SARGraph):
            return super().forward(x, edge_index, edge_weight)
        _no_tuple(x, "GCNConv")
        if edge_weight is not None:
            raise NotImplementedError("GCNConv under SAR takes no edge_weight (unweighted graphs)")
        if not (self.normalize and self.add_self_loops):
            raise NotImplementedError(
                "GCNConv under SAR supports the default normalize=True, add_self_loops=True"
            )
        graph = edge_index
        x = self.lin(x)
        # not self.improved: without edge weights PyG's gcn_norm gives the added loops weight 1 either
        # way (add_remaining_self_loops fills no weight where there is none), and SAR equals PyG
        out = sar_aggregate(graph.with_self_loops(), x, "sum", gcn_edge_weight(graph))
        if self.bias is not None:
            out = out + self.bias
        return out


class SARBatchNorm(torch.nn.BatchNorm1d):
    r""":class:`torch.nn.BatchNorm1d` whose training statistics span the
    nodes of *all* workers, as on the full graph:

    .. math::
        \mu = \frac{1}{N}\sum_p \sum_{i \in \mathcal{V}_p} \mathbf{x}_i,
        \qquad \sigma^2 = \frac{1}{N}\sum_p \sum_{i \in \mathcal{V}_p}
        (\mathbf{x}_i - \mu)^2,

    both sums all-reduced with a differentiable all-reduce, so the
    gradients are exactly those of single-process BatchNorm. Running
    statistics use the unbiased :math:`\sigma^2 N/(N-1)` like PyTorch. In
    eval mode, or without a process group, it is plain BatchNorm.
    """

    def forward(self, x: Tensor) -> Tensor:
        if not (self.training and dist.is_initialized() and dist.get_world_size() > 1):
            return super().forward(x)
        if x.dim() != 2:
            raise NotImplementedError("SARBatchNorm takes [nodes, channels]")
        n = AllReduceSum.apply(x.new_full((1,), float(x.size(0))))
        mean = AllReduceSum.apply(x.sum(0)) / n
        var = AllReduceSum.apply(((x - mean) ** 2).sum(0)) / n
        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked += 1
                m = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
                N = float(n)
                self.running_mean.mul_(1 - m).add_(m * mean.detach())
                self.running_var.mul_(1 - m).add_(m * var.detach() * N / max(N - 1, 1.0))
        out = (x - mean) / torch.sqrt(var + self.eps)
        if self.affine:
            out = out * self.weight + self.bias
        return out


def _unsupported(cls: type, owner: str, forms: Dict[type, type]) -> str:
    """The message for a conv layer ``cls`` without SAR implementation inside the conv type ``owner``."""
    from revgnn.nn import list_convs

    where = f"conv {owner!r} is built on {cls.__name__}, which" if owner else cls.__name__
    usable = [name for name in list_convs() if not sar_unsupported(name)]
    return (
        f"{where} has no SAR implementation (unsupported under SAR). Under SAR use one of the "
        f"convs {', '.join(usable)} (PyG {', '.join(c.__name__ for c in forms)}), or train "
        f"this model with backend=local or backend=ddp, which need no SAR version (a conv "
        f"runs under SAR once its registration names its SAR form: register_conv(..., sar=...))."
    )


def sar_unsupported(conv: str) -> str:
    """Why the registered conv type ``conv`` (built with its default options) cannot run under
    SAR, or ``''`` when every PyG layer it holds has a SAR form (:func:`sar_forms`). (Some options
    are checked only at run time, e.g. SAGEConv's LSTM aggregation.)"""
    from revgnn.nn import conv_spec

    spec = conv_spec(conv)
    forms = sar_forms()
    block = spec.block(4, **({"edge_channels": 4} if spec.uses_edges else {}))
    for m in block.modules():
        cls = type(m)
        if isinstance(m, MessagePassing) and cls not in forms and cls not in forms.values():
            return f"conv {conv!r} is built on {cls.__name__}, which has no SAR implementation"
    return ""


def convert_to_sar(module: torch.nn.Module) -> torch.nn.Module:
    """Switches every supported PyG conv inside ``module`` to its SAR form (the one its conv's
    registration names, :func:`sar_forms`), and every ``BatchNorm1d`` to :class:`SARBatchNorm`, in place
    (same parameters, same ``state_dict``) and returns ``module``. Convs already converted are left
    alone; any other ``MessagePassing`` layer is an error naming the registered conv type it
    belongs to and what to use instead, since it would silently need the whole graph."""
    from revgnn.nn.conv_registry import conv_name

    owners: Dict[int, str] = {}  # id of a module -> name of the registered conv block holding it
    for m in module.modules():
        name = owners.get(id(m)) or conv_name(m)
        if name:
            for sub in m.modules():
                owners[id(sub)] = name
    forms = sar_forms()
    for m in module.modules():
        cls = type(m)
        if isinstance(m, MessagePassing) and cls not in forms and cls not in forms.values():
            raise NotImplementedError(_unsupported(cls, owners.get(id(m), ""), forms))
    for m in module.modules():
        cls = type(m)
        if cls in forms:
            m.__class__ = forms[cls]
        elif cls is torch.nn.BatchNorm1d:
            m.__class__ = SARBatchNorm
    return module
