r"""Pre-activation graph convolution blocks: Norm -> ReLU -> shared dropout -> Conv.

These are the functions :math:`f_{\mathbf{w}}` that RevGNN wraps in
:class:`~revgnn.nn.GroupAddRev` (or that a res+ model adds to its input):

.. math::
    f_{\mathbf{w}}(\mathbf{X}, \mathbf{A}, \mathbf{U}) =
    \mathrm{Conv}\big(\mathbf{M} \odot \mathrm{ReLU}(\mathrm{Norm}(\mathbf{X})),
    \mathbf{A}, \mathbf{U}\big)

with :math:`\mathbf{M}` the mask of :class:`~revgnn.nn.SharedDropout`. Every
block has the signature ``block(x, edge_index, edge_attr=None,
dropout_mask=None)`` and maps ``[N, channels]`` to ``[N, channels]``, so a
block of ``channels = hidden / C`` is one group of a :math:`C`-group
reversible layer. The convolutions are PyG's. Each block is registered by name
with :func:`~revgnn.nn.conv_registry.register_conv` (``RevGNN(conv="gen")``),
naming the SAR form of its conv (:mod:`revgnn.distributed.convs`); a new conv
type is one more decorated class here.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional

from torch import Tensor, nn
from torch_geometric.nn import GATConv, GCNConv, GENConv, GINConv, GraphNorm, SAGEConv
from torch_geometric.typing import Adj, OptTensor

from revgnn.nn.conv_registry import register_conv
from revgnn.nn.edge_features import LinearEdgeFeatures
from revgnn.nn.gat import gat_conv
from revgnn.nn.gen_max import gen_conv
from revgnn.nn.linear_aggr import gcn_conv, gin_conv, sage_conv
from revgnn.nn.norm_act import layer_norm_relu
from revgnn.nn.ops import mask_values
from revgnn.utils.ranges import Range

#: Where the SAR forms of the built-in convs live (named, not imported: the distributed package
#: builds on this one).
_SAR = "revgnn.distributed.convs:"

NORMS = ("layer", "batch", "graph", None)
#: The ``norm`` a block or model takes (``None`` or ``"none"``: no norm); the annotation is what
#: configs are checked against (:mod:`revgnn.utils.signature`).
Norm = Optional[Literal["layer", "batch", "graph", "none"]]
#: GENConv's aggregations (``"add"`` and ``"sum"`` are the same).
GENAggr = Literal["max", "softmax", "mean", "add", "sum", "powermean"]


def make_norm(norm: Optional[str], channels: int) -> Optional[nn.Module]:
    """``'layer'`` -> LayerNorm, ``'batch'`` -> BatchNorm1d, ``'graph'`` -> PyG's
    GraphNorm (per-graph statistics; blocks then need the ``batch`` vector),
    ``None`` -> no norm."""
    if norm == "layer":
        return nn.LayerNorm(channels)
    if norm == "batch":
        return nn.BatchNorm1d(channels)
    if norm == "graph":
        return GraphNorm(channels)
    if norm is None or norm == "none":
        return None
    raise ValueError(f"unknown norm {norm!r}; choose one of 'layer', 'batch', 'graph', None")


class PreActBlock(nn.Module):
    r"""Base class: Norm -> ReLU -> dropout mask -> :meth:`conv_forward`.

    A subclass implements :meth:`conv_forward` and is registered with
    :func:`~revgnn.nn.conv_registry.register_conv`; its ``__init__`` takes
    ``channels, ..., norm, preact`` (and ``edge_channels`` if it uses edge
    features).

    Args:
        channels (int): Feature width in and out.
        norm (str, optional): ``'layer'``, ``'batch'``, ``'graph'`` or
            :obj:`None`. (default: :obj:`'layer'`)
        preact (bool, optional): Apply Norm -> ReLU before the conv; the first
            layer of a res+ model sets :obj:`False`. (default: :obj:`True`)
    """

    def __init__(self, channels: int, norm: Optional[str] = "layer", preact: bool = True):
        super().__init__()
        self.channels = channels
        self.preact = preact
        self.norm = make_norm(norm, channels) if preact else None

    def reset_parameters(self) -> None:
        for module in self.children():
            if hasattr(module, "reset_parameters"):
                module.reset_parameters()

    def conv_forward(self, h: Tensor, edge_index: Adj, edge_attr: OptTensor) -> Tensor:
        raise NotImplementedError

    def forward(
        self,
        x: Tensor,
        edge_index: Adj,
        edge_attr: OptTensor = None,
        dropout_mask: OptTensor = None,
        batch: OptTensor = None,
        num_graphs: Optional[int] = None,
        dropout_scale: float = 1.0,
    ) -> Tensor:
        """``batch`` (graph index per node) and ``num_graphs`` are used by GraphNorm only; in a
        :class:`~revgnn.nn.GroupAddRev` every group receives them whole. Without ``num_graphs``
        GraphNorm reads ``batch.max()`` back, a host sync per block that ``torch.export`` cannot
        trace. A bool ``dropout_mask`` (:class:`~revgnn.nn.SharedDropout` with ``compact=True``)
        stands for ``dropout_scale`` where true and 0 where false."""
        h = x
        if self.preact and isinstance(self.norm, nn.LayerNorm):  # one fused pass where it applies
            h = layer_norm_relu(h, self.norm, dropout_mask, dropout_scale)
            return self.conv_forward(h, edge_index, edge_attr)
        if self.preact:
            if isinstance(self.norm, GraphNorm):
                h = self.norm(h, batch, num_graphs)
            elif self.norm is not None:
                h = self.norm(h)
            h = h.relu()
        if dropout_mask is not None:
            h = h * mask_values(dropout_mask, dropout_scale, h)
        return self.conv_forward(h, edge_index, edge_attr)

    def extra_repr(self) -> str:
        return f"channels={self.channels}"


@register_conv("gen", factored_edges=True, sar=_SAR + "SARGENConv")
class GENBlock(PreActBlock):
    r"""DeeperGCN's GENConv (Li et al., 2020) in a pre-activation block.

    .. math::
        \mathbf{x}_i' = \mathrm{MLP}\Big(\mathbf{x}_i + \mathrm{AGG}\big(\{
        \mathrm{ReLU}(\mathbf{x}_j + \mathbf{W}_e\mathbf{e}_{ji} + \mathbf{b}_e)
        + \epsilon : j \in \mathcal{N}(i)\}\big)\Big)

    with a 2-layer MLP (``c -> 2c -> c``, LayerNorm inside, biases) and a
    per-block edge encoder :math:`\mathbf{W}_e` (``edge_channels -> channels``).
    ``edge_attr`` may be raw ``[E, edge_channels]`` features or a
    :class:`~revgnn.nn.edge_features.LinearEdgeFeatures` (the model's shared
    edge embedding in factored form, which makes the per-block encoder 10x
    cheaper on proteins). Max aggregation runs through
    :func:`~revgnn.nn.gen_max.gen_max_aggregate`, whose C++ kernel then never
    forms the :math:`E \times C` edge encoding or messages at all (the PyTorch
    fallback keeps one :math:`E \times C` tensor); sum, mean and softmax (learnable
    temperature or not) through :func:`~revgnn.nn.gen_max.gen_aggregate`, which forms no
    :math:`E \times C` tensor in any implementation (its PyTorch one streams the edges in
    chunks); powermean runs PyG's ``GENConv``, which forms the messages. Pass a destination-sorted
    :class:`torch_geometric.EdgeIndex` to avoid sorting edges in every call.
    With ``channels=40, edge_channels=80`` and LayerNorm this is exactly 10,000
    parameters, one group of RevGNN-Deep.

    Args:
        channels (int): Feature width in and out.
        edge_channels (int, optional): Width of the edge features it receives;
            :obj:`None` for no edge features. (default: :obj:`None`)
        aggr (str, optional): ``'max'``, ``'softmax'``, ``'mean'``, ``'add'`` (or ``'sum'``),
            ``'powermean'``. (default: :obj:`'max'`)
        learn_t (bool, optional): Learn the softmax temperature.
            (default: :obj:`False`)
        t (float, optional): Initial softmax temperature. (default: :obj:`1.0`)
        mlp_layers (int, optional): Layers of the MLP. (default: :obj:`2`)
        mlp_norm (bool, optional): LayerNorm inside the MLP (PyG's ``norm='layer'``);
            :obj:`False` for none (DEQ-GNN's contraction needs a Lipschitz bound, which LayerNorm
            lacks). (default: :obj:`True`)
        norm (str, optional): Pre-activation norm. (default: :obj:`'layer'`)
        preact (bool, optional): See :class:`PreActBlock`. (default: :obj:`True`)
    """

    def __init__(
        self,
        channels: int,
        edge_channels: Optional[int] = None,
        aggr: GENAggr = "max",
        learn_t: bool = False,
        t: float = 1.0,
        mlp_layers: Annotated[int, Range(1)] = 2,
        mlp_norm: bool = True,
        norm: Norm = "layer",
        preact: bool = True,
    ):
        super().__init__(channels, norm, preact)
        self.edge_encoder = nn.Linear(edge_channels, channels) if edge_channels else None
        self.conv = GENConv(
            channels,
            channels,
            aggr=aggr,
            t=t,
            learn_t=learn_t,
            num_layers=mlp_layers,
            norm="layer" if mlp_norm else None,
            bias=True,
        )

    def conv_forward(self, h: Tensor, edge_index: Adj, edge_attr: OptTensor) -> Tensor:
        # the edge encoder stays in factored form: the aggregation kernel applies it per edge in
        # registers; anything else expands it (gen_conv)
        if isinstance(edge_attr, LinearEdgeFeatures):
            edge_attr = edge_attr.compose(self.edge_encoder)
        elif edge_attr is not None and self.edge_encoder is not None:
            edge_attr = LinearEdgeFeatures.from_linear(edge_attr, self.edge_encoder)
        return gen_conv(self.conv, h, edge_index, edge_attr)

    def extra_repr(self) -> str:
        return f"channels={self.channels}, aggr={self.conv.aggr}"


@register_conv("gat", factored_edges=True, sar=_SAR + "SARGATConv")
class GATBlock(PreActBlock):
    r"""GATConv (Veličković et al., 2018) with concatenated heads in a pre-activation block.

    The conv runs through :func:`~revgnn.nn.gat.gat_conv`: the same function as PyG's ``GATConv``
    (its parameters, self loops with the mean edge feature) from one fused operator that forms no
    :math:`E \times C` tensor, keeps edge features in factored form
    (:class:`~revgnn.nn.edge_features.LinearEdgeFeatures`) and draws the attention-dropout mask
    from a counter-based hash, so a reversible recompute redraws it without storing it.

    Args:
        channels (int): Feature width in and out (divisible by ``heads``).
        heads (int, optional): Attention heads. (default: :obj:`1`)
        edge_channels (int, optional): Edge feature width used in attention.
            (default: :obj:`None`)
        attn_dropout (float, optional): Dropout on attention coefficients; a
            stochastic layer that :class:`~revgnn.nn.GroupAddRev` replays
            exactly. (default: :obj:`0.0`)
        norm (str, optional): Pre-activation norm. (default: :obj:`'layer'`)
    """

    def __init__(
        self,
        channels: int,
        heads: Annotated[int, Range(1)] = 1,
        edge_channels: Optional[int] = None,
        attn_dropout: Annotated[float, Range(0, 1, high_open=True)] = 0.0,
        norm: Norm = "layer",
        preact: bool = True,
    ):
        super().__init__(channels, norm, preact)
        if channels % heads != 0:
            raise ValueError(f"GATBlock: channels={channels} must be divisible by heads={heads}")
        if not 0.0 <= attn_dropout < 1.0:  # the dropout hash's threshold (revgnn.nn.ops.attention_keep)
            raise ValueError(f"GATBlock: attn_dropout={attn_dropout} must be in [0, 1)")
        self.conv = GATConv(
            channels, channels // heads, heads=heads, dropout=attn_dropout, edge_dim=edge_channels
        )

    def conv_forward(self, h: Tensor, edge_index: Adj, edge_attr: OptTensor) -> Tensor:
        # the fused attention operator: no E x C tensor, edge features kept factored (revgnn.nn.gat)
        return gat_conv(self.conv, h, edge_index, edge_attr)


@register_conv("gcn", sar=_SAR + "SARGCNConv")
class GCNBlock(PreActBlock):
    r"""GCNConv (Kipf & Welling, 2017) in a pre-activation block (no edge features); its symmetric
    normalisation and aggregation run as one weighted segment sum (:func:`~revgnn.nn.linear_aggr.gcn_conv`),
    never forming the :math:`E \times C` messages."""

    def __init__(self, channels: int, norm: Norm = "layer", preact: bool = True):
        super().__init__(channels, norm, preact)
        self.conv = GCNConv(channels, channels)

    def conv_forward(self, h: Tensor, edge_index: Adj, edge_attr: OptTensor) -> Tensor:
        return gcn_conv(self.conv, h, edge_index)


@register_conv("sage", sar=_SAR + "SARSAGEConv")
class SAGEBlock(PreActBlock):
    r"""SAGEConv (Hamilton et al., 2017) in a pre-activation block (no edge features); its mean, sum or
    max aggregation runs as one segment reduction (:func:`~revgnn.nn.linear_aggr.sage_conv`), never
    forming the :math:`E \times C` messages."""

    def __init__(
        self,
        channels: int,
        aggr: Literal["mean", "max", "add", "sum"] = "mean",
        norm: Norm = "layer",
        preact: bool = True,
    ):
        super().__init__(channels, norm, preact)
        self.conv = SAGEConv(channels, channels, aggr=aggr)

    def conv_forward(self, h: Tensor, edge_index: Adj, edge_attr: OptTensor) -> Tensor:
        return sage_conv(self.conv, h, edge_index)


@register_conv("gin", sar=_SAR + "SARGINConv")
class GINBlock(PreActBlock):
    r"""GINConv (Xu et al., 2019) with a 2-layer MLP in a pre-activation block; its sum aggregation
    runs as one segment sum (:func:`~revgnn.nn.linear_aggr.gin_conv`), never forming the
    :math:`E \times C` messages."""

    def __init__(self, channels: int, norm: Norm = "layer", preact: bool = True):
        super().__init__(channels, norm, preact)
        mlp = nn.Sequential(nn.Linear(channels, channels), nn.ReLU(), nn.Linear(channels, channels))
        self.conv = GINConv(mlp, train_eps=True)

    def conv_forward(self, h: Tensor, edge_index: Adj, edge_attr: OptTensor) -> Tensor:
        return gin_conv(self.conv, h, edge_index)


class Residual(nn.Module):
    r"""Plain residual connection :math:`\mathbf{X}' = \mathbf{X} + f(\mathbf{X}, \ldots)`
    (the res+ block of DeeperGCN); stores activations for backward."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block

    def reset_parameters(self) -> None:
        self.block.reset_parameters()

    def forward(self, x: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        return x + self.block(x, *args, **kwargs)

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.block})"
