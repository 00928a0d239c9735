r"""Graph-level RevGNN for molecular property prediction (ogbg-molhiv) and its registered variants.

The RevGNN paper (Li et al., ICML 2021) also trains reversible GNNs on ogbg-molhiv, with GraphNorm and
with BatchNorm inside the blocks (their scores: the registry's ``Reported`` entries below). The authors
did not release that code; the variants here use DeeperGCN's ogbg-molhiv recipe (Li et al., 2020:
GENConv with learnable softmax aggregation, t = 1, 256 channels, 7 layers, 1-layer MLP in the conv,
dropout 0.2, mean readout) with the residual blocks replaced by 2-group reversible blocks.
"""

from __future__ import annotations

import inspect
from typing import Annotated, Any, Dict, Literal, Mapping, Optional, Tuple, get_args

import torch
from torch import Tensor, nn
from torch_geometric.nn import GraphNorm, global_add_pool, global_max_pool, global_mean_pool
from torch_geometric.nn.aggr import AttentionalAggregation
from torch_geometric.typing import Adj, OptTensor

from revgnn.models.components import (
    block_builder,
    block_options,
    check_conv_options,
    conv_of,
    conv_parameters,
    reversible_layers,
    reversible_repr,
)
from revgnn.models.paper import LI_2021, MOLHIV
from revgnn.models.registry import Reported, register_model
from revgnn.nn import Shared, SharedDropout, conv_spec
from revgnn.nn.blocks import Norm, make_norm
from revgnn.nn.graph_input import check_features, sort_edges
from revgnn.utils.ranges import Range
from revgnn.utils.signature import check_call, with_defaults

__all__ = ["GraphRevGNN", "READOUTS", "ENCODERS"]

Readout = Literal["mean", "sum", "max", "attention"]
Encoder = Literal["ogb", "linear"]
#: The readouts and the node/edge encoders :class:`GraphRevGNN` takes (its annotations' choices).
READOUTS, ENCODERS = get_args(Readout), get_args(Encoder)

#: DeeperGCN's ogbg-molhiv recipe with reversible blocks (the norm inside them aside).
_MOLHIV_RECIPE = dict(
    num_layers=7, hidden_channels=256, num_groups=2, aggr="softmax", learn_t=True, dropout=0.2, readout="mean"
)


class GraphRevGNN(nn.Module):
    r"""A reversible deep GNN for graph-level prediction on batches of graphs.

    .. math::
        \mathbf{H}^{(0)} &= \mathrm{AtomEncoder}(\mathbf{X}), \quad
        \mathbf{U} = \mathrm{BondEncoder}(\mathbf{E}), \quad
        \mathbf{M} \sim \mathrm{SharedDropout}

        \mathbf{H}^{(\ell)} &= \mathrm{GroupAddRev}_\ell(\mathbf{H}^{(\ell-1)},
        \mathbf{A}, \mathbf{U}, \mathbf{M}, \mathbf{b}), \quad \ell = 1, \ldots, L

        \mathbf{y}_g &= \mathrm{Linear}\big(\mathrm{Dropout}(\mathrm{Readout}_{i \in g}
        \mathrm{ReLU}(\mathrm{Norm}(\mathbf{H}^{(L)}))_i)\big)

    Each group function is a pre-activation block of the registered ``conv`` (Norm -> ReLU ->
    shared dropout -> Conv; by default GENConv with DeeperGCN's ogbg-molhiv options: learnable
    softmax aggregation, a 1-layer MLP) of width ``hidden_channels / num_groups``. With
    ``norm='graph'`` every group normalises with per-graph statistics (GraphNorm, Cai et al. 2021),
    which needs the graph index ``batch`` of each node; every group receives it whole. With
    ``norm='batch'`` the running statistics are updated once per training step, as in the equivalent
    non-reversible model. Training memory does not grow with ``num_layers``.

    Args:
        in_channels (int): Node features: the number of categorical atom features for
            ``encoder='ogb'`` (9 for OGB molecules), the feature width for ``'linear'``.
        hidden_channels (int): Hidden width (divisible by ``num_groups``).
        out_channels (int): Tasks (or classes) per graph.
        num_layers (int): Number of reversible blocks :math:`L`.
        num_groups (int, optional): Groups per block :math:`C`. (default: :obj:`2`)
        conv (str, optional): A conv registered with :func:`~revgnn.nn.register_conv`
            (``'gen'``, ``'gat'``, ``'gcn'``, ``'sage'``, ``'gin'``, or one of yours).
            (default: :obj:`'gen'`)
        edge_channels (int, optional): Edge features (3 categorical bond features for
            ``'ogb'``); :obj:`None` for none; ignored by convs without edge features.
            (default: :obj:`None`)
        species_channels (int, optional): Accepted for the training loop's uniform call; must be
            :obj:`0` (graph data sets have no species one-hot). (default: :obj:`0`)
        dropout (float, optional): Shared dropout in the blocks and dropout before the final
            linear layer. (default: :obj:`0.0`)
        norm (str, optional): ``'graph'``, ``'batch'``, ``'layer'`` or :obj:`None`; used inside the
            blocks and before the readout. (default: :obj:`'graph'`)
        readout (str, optional): ``'mean'``, ``'sum'``, ``'max'`` or ``'attention'``
            (gated attention pooling, Li et al. 2016). (default: :obj:`'mean'`)
        encoder (str, optional): ``'ogb'``: OGB's ``AtomEncoder``/``BondEncoder`` (sums of
            embeddings of categorical features); ``'linear'``: linear maps of float features.
            (default: :obj:`'ogb'`)
        weight_tied (bool, optional): One block applied ``num_layers`` times. (default: :obj:`False`)
        reversible (bool, optional): :obj:`False` runs the same blocks as a plain residual stack that
            stores activations (reference and baseline). (default: :obj:`True`)
        keep_every (int, optional): Store the input of every ``keep_every``-th block to bound float32
            reconstruction drift; :obj:`0` keeps none. (default: :obj:`0`)
        quantize (int, optional): Exact coupling on a :math:`2^{-q}` grid in every block (see
            :class:`~revgnn.nn.GroupAddRev`). (default: :obj:`None`)
        **conv_options: Options of the conv, forwarded to its block (the ``options`` of its
            :class:`~revgnn.nn.ConvSpec`), checked as :class:`~revgnn.models.RevGNN` checks them;
            for ``gen`` this model's defaults are :attr:`conv_defaults` (``aggr='softmax'``,
            ``learn_t=True``, ``mlp_layers=1``; ``t`` stays 1.0), for other convs the block's.
    """

    #: The options the blocks of a conv get unless set: DeeperGCN's ogbg-molhiv GENConv.
    conv_defaults: Mapping[str, Mapping[str, Any]] = {"gen": dict(aggr="softmax", learn_t=True, mlp_layers=1)}

    def __init__(
        self,
        in_channels: int,
        hidden_channels: Annotated[int, Range(1)],
        out_channels: int,
        num_layers: Annotated[int, Range(1)],
        num_groups: Annotated[int, Range(1)] = 2,
        conv: str = "gen",
        edge_channels: Optional[int] = None,
        species_channels: int = 0,
        dropout: Annotated[float, Range(0, 1, high_open=True)] = 0.0,
        norm: Norm = "graph",
        readout: Readout = "mean",
        encoder: Encoder = "ogb",
        weight_tied: bool = False,
        reversible: bool = True,
        keep_every: Annotated[int, Range(0)] = 0,
        quantize: Annotated[Optional[int], Range(1)] = None,
        **conv_options: Any,
    ):
        check_call(GraphRevGNN, locals())
        self.check_options({**locals(), **conv_options})
        super().__init__()
        self.in_channels, self.edge_channels = in_channels, edge_channels
        self.num_layers, self.weight_tied, self.encoder = num_layers, weight_tied, encoder
        edges = bool(edge_channels) and conv_spec(conv).uses_edges  # a conv without edge features: no encoder
        if encoder == "ogb":
            from ogb.graphproppred.mol_encoder import AtomEncoder, BondEncoder
            from ogb.utils.features import get_atom_feature_dims, get_bond_feature_dims

            atoms, bonds = len(get_atom_feature_dims()), len(get_bond_feature_dims())
            if in_channels != atoms or edge_channels not in (None, bonds):
                raise ValueError(
                    f"encoder='ogb' embeds OGB's {atoms} atom and {bonds} bond features; "
                    f"the data has in_channels={in_channels}, edge_channels="
                    f"{edge_channels} (use encoder='linear' for float features)"
                )
            self.node_encoder = AtomEncoder(hidden_channels)
            self.edge_encoder = BondEncoder(hidden_channels) if edges else None
        else:
            self.node_encoder = nn.Linear(in_channels, hidden_channels)
            self.edge_encoder = nn.Linear(edge_channels, hidden_channels) if edges else None
        self.conv = conv
        self.dropout = SharedDropout(dropout)
        make = block_builder(
            conv,
            norm,
            hidden_channels if edge_channels else None,
            **block_options(GraphRevGNN, conv, conv_options),
        )
        self.layers = reversible_layers(
            lambda: make(hidden_channels // num_groups),
            hidden_channels,
            num_groups,
            num_layers,
            weight_tied,
            reversible,
            keep_every,
            quantize,
        )
        self.norm = make_norm(norm, hidden_channels)
        self.readout = readout
        self.attention = (
            AttentionalAggregation(nn.Linear(hidden_channels, 1)) if readout == "attention" else None
        )
        self.head_dropout = nn.Dropout(dropout)
        self.lin = nn.Linear(hidden_channels, out_channels)

    @classmethod
    def forwarded_options(
        cls, arguments: Mapping[str, Any], prefix: str = ""
    ) -> Tuple[Dict[str, inspect.Parameter], str]:
        """The parameters ``**conv_options`` may hold for the constructor ``arguments``
        (:func:`~revgnn.models.components.conv_parameters`) and whose they are."""
        return conv_parameters(cls, arguments, prefix), f"conv {conv_of(cls, arguments)!r}"

    @classmethod
    def check_options(cls, arguments: Mapping[str, Any], prefix: str = "") -> None:
        """What no single annotation says, for constructor ``arguments`` (unset ones keep their
        defaults): no species one-hot (graph data sets have none), the conv options fit the conv's
        block and ``hidden_channels`` is divisible by ``num_groups``
        (:func:`~revgnn.models.components.check_conv_options`). The constructor and the
        check before a run starts (:func:`revgnn.models.check_model_config`) call it; ``prefix``
        goes before every key an error names. Raises :class:`ValueError`."""
        arguments = with_defaults(cls, arguments)
        species = arguments["species_channels"]
        if species:
            raise ValueError(
                f"GraphRevGNN has no species encoder; {prefix}species_channels must be 0, got {species}"
            )
        check_conv_options(cls, arguments, prefix)

    def reset_parameters(self) -> None:
        for module in self.modules():
            if module is not self and hasattr(module, "reset_parameters"):
                module.reset_parameters()
        if self.encoder == "ogb":  # OGB's encoders initialise in __init__ only (xavier_uniform)
            for emb in self.modules():
                if isinstance(emb, nn.Embedding):
                    nn.init.xavier_uniform_(emb.weight)

    def forward(
        self,
        x: Tensor,
        edge_index: Adj,
        edge_attr: OptTensor = None,
        batch: OptTensor = None,
        num_graphs: Optional[int] = None,
    ) -> Tensor:
        """Returns ``[num_graphs, out_channels]`` logits; ``batch`` maps nodes to graphs (:obj:`None`:
        one graph)."""
        if x.size(-1) != self.in_channels:
            raise ValueError(
                f"the model expects {self.in_channels} node features, got {x.size(-1)}; "
                f"set in_channels to match the data"
            )
        check_features(next(self.parameters()), x=x, edge_attr=edge_attr)
        if batch is None:
            batch = torch.zeros(x.size(0), dtype=torch.long, device=x.device)
        if num_graphs is None:
            num_graphs = int(batch.max()) + 1 if batch.numel() else 0
        edge_index, edge_attr = sort_edges(edge_index, edge_attr, x.size(0))
        h = self.node_encoder(x)
        edges = Shared(
            self.edge_encoder(edge_attr) if self.edge_encoder is not None and edge_attr is not None else None
        )
        mask = self.dropout(h)
        h = self.layers(h, edge_index, edges, mask, batch=batch, num_graphs=num_graphs)
        if self.norm is not None:
            h = self.norm(h, batch, num_graphs) if isinstance(self.norm, GraphNorm) else self.norm(h)
        h = h.relu()
        if self.readout == "mean":
            g = global_mean_pool(h, batch, num_graphs)
        elif self.readout == "sum":
            g = global_add_pool(h, batch, num_graphs)
        elif self.readout == "max":
            g = global_max_pool(h, batch, num_graphs)
        else:
            g = self.attention(h, batch, dim_size=num_graphs)
        return self.lin(self.head_dropout(g))

    def __repr__(self) -> str:
        return reversible_repr(self, f", readout={self.readout}")


@register_model(
    GraphRevGNN,
    dataset="ogbg-molhiv",
    num_parameters=745_999,
    paper=LI_2021,
    reported=[
        Reported(
            "RevGNN + GraphNorm",
            "test ROC-AUC",
            78.62,
            source="Li et al. 2021, ogbg-molhiv results",
            experiment="molhiv_revgnn_graphnorm",
            note="the authors released no code for it; DeeperGCN's ogbg-molhiv recipe here",
        )
    ],
)
def revgnn_molhiv() -> Dict[str, Any]:
    """Graph-level RevGNN with GraphNorm in the blocks: 7 reversible GENConv blocks x 256 channels
    (2 groups), learnable softmax aggregation, dropout 0.2, mean readout."""
    return dict(MOLHIV, **_MOLHIV_RECIPE, norm="graph")


@register_model(
    GraphRevGNN,
    dataset="ogbg-molhiv",
    num_parameters=743_951,
    paper=LI_2021,
    reported=[
        Reported(
            "RevGNN + BatchNorm",
            "test ROC-AUC",
            77.82,
            source="Li et al. 2021, ogbg-molhiv results",
            experiment="molhiv_revgnn_batchnorm",
            note="the authors released no code for it; DeeperGCN's ogbg-molhiv recipe here",
        )
    ],
)
def revgnn_molhiv_batchnorm() -> Dict[str, Any]:
    """:func:`revgnn_molhiv` with BatchNorm in the blocks."""
    return dict(MOLHIV, **_MOLHIV_RECIPE, norm="batch")


@register_model(GraphRevGNN, dataset="mol_like", num_parameters=63_953)
def revgnn_mol_small() -> Dict[str, Any]:
    """CPU-sized graph-level RevGNN for the generated ``mol_like`` set: 8 reversible GENConv blocks
    x 64 channels (2 groups), GraphNorm, learnable softmax aggregation, dropout 0.1, mean readout."""
    return dict(
        MOLHIV,
        num_layers=8,
        hidden_channels=64,
        num_groups=2,
        norm="graph",
        aggr="softmax",
        learn_t=True,
        dropout=0.1,
        readout="mean",
    )
