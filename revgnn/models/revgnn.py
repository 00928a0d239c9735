"""RevGNN and WT-RevGNN (Li et al., ICML 2021) and their registered variants."""

from __future__ import annotations

from typing import Annotated, Any, Dict, Literal, Optional

from torch import Tensor
from torch_geometric.typing import Adj, OptTensor

from revgnn.models.components import DeepNodeGNN, reversible_layers, reversible_repr
from revgnn.models.paper import ABLATION_112, LI_2021, PROTEINS
from revgnn.models.registry import Reported, register_model
from revgnn.nn.blocks import Norm
from revgnn.utils.ranges import Range
from revgnn.utils.signature import check_call


class RevGNN(DeepNodeGNN):
    r"""The reversible deep GNN of `"Training Graph Neural Networks with 1000
    Layers" <https://arxiv.org/abs/2106.07476>`_ (Li et al., ICML 2021).

    .. math::
        \mathbf{H}^{(0)} &= \mathrm{NodeEncoder}(\mathbf{X}), \quad
        \mathbf{U} = \mathbf{W}_e \mathbf{E} + \mathbf{b}_e, \quad
        \mathbf{M} \sim \mathrm{SharedDropout}

        \mathbf{H}^{(\ell)} &= \mathrm{GroupAddRev}_\ell(\mathbf{H}^{(\ell-1)},
        \mathbf{A}, \mathbf{U}, \mathbf{M}), \quad \ell = 1, \ldots, L

        \mathbf{Y} &= \mathrm{Linear}(\mathrm{Dropout}(\mathrm{ReLU}(
        \mathrm{LayerNorm}(\mathbf{H}^{(L)}))))

    where each group function is a pre-activation block (Norm -> ReLU ->
    shared dropout -> Conv) of width ``hidden_channels / num_groups``. The edge
    embedding :math:`\mathbf{U}` is shared by all layers and every group gets
    it whole (each block has its own ``hidden -> hidden / C`` edge encoder).
    Training memory does not grow with ``num_layers``. With ``weight_tied``
    one block is applied ``num_layers`` times (WT-RevGNN).

    Args:
        in_channels (int): Node feature width.
        hidden_channels (int): Hidden width (divisible by ``num_groups``).
        out_channels (int): Output width (tasks or classes).
        num_layers (int): Number of reversible blocks :math:`L`.
        num_groups (int, optional): Groups per block :math:`C`. (default: :obj:`2`)
        conv (str, optional): ``'gen'``, ``'gat'``, ``'gcn'``, ``'sage'`` or
            ``'gin'``. (default: :obj:`'gen'`)
        edge_channels (int, optional): Raw edge feature width; used by
            ``gen``/``gat``, ignored by convs without edge features.
            (default: :obj:`None`)
        species_channels (int, optional): Trailing one-hot columns of the node
            features with their own encoder (proteins: 8). (default: :obj:`0`)
        dropout (float, optional): Shared dropout in the blocks and dropout in
            the head. (default: :obj:`0.0`)
        norm (str, optional): Norm inside blocks. (default: :obj:`'layer'`)
        weight_tied (bool, optional): One block applied ``num_layers`` times.
            (default: :obj:`False`)
        reversible (bool, optional): :obj:`False` runs the same blocks as a
            plain stack that stores activations (reference and baseline).
            (default: :obj:`True`)
        keep_every (int, optional): Store the input of every ``keep_every``-th
            block to bound float32 reconstruction drift; :obj:`0` keeps none.
            (default: :obj:`0`)
        quantize (int, optional): Exact coupling on a :math:`2^{-q}` grid in
            every block: bit-exact reconstruction at any depth, also under bf16
            autocast (see :class:`~revgnn.nn.GroupAddRev`). (default: :obj:`None`)
        group_init (str, optional): ``'copy'`` starts every group of a block as
            a copy of its first group, :math:`\mathbf{w}_{\ell,i} =
            \mathbf{w}_{\ell,1}` (the official RevGNN code); ``'independent'``
            initialises each group on its own. (default: :obj:`'independent'`)
        **conv_options: Options of the conv, forwarded to its block: the keyword parameters of
            the registered block's ``__init__`` besides ``channels``, ``norm``, ``preact`` and
            ``edge_channels`` (the ``options`` of its :class:`~revgnn.nn.ConvSpec`), e.g.
            ``aggr``, ``learn_t``, ``t``, ``mlp_layers`` of ``gen`` (:class:`~revgnn.nn.GENBlock`), ``heads``,
            ``attn_dropout`` of ``gat``, ``aggr`` of ``sage``; unset ones keep the block's
            defaults, and one the block does not take is an error naming the conv.
    """

    def __init__(
        self,
        in_channels: int,
        hidden_channels: Annotated[int, Range(1)],
        out_channels: int,
        num_layers: Annotated[int, Range(1)],
        num_groups: Annotated[int, Range(1)] = 2,
        conv: str = "gen",
        edge_channels: Optional[int] = None,
        species_channels: Annotated[int, Range(0)] = 0,
        dropout: Annotated[float, Range(0, 1, high_open=True)] = 0.0,
        norm: Norm = "layer",
        weight_tied: bool = False,
        reversible: bool = True,
        keep_every: Annotated[int, Range(0)] = 0,
        quantize: Annotated[Optional[int], Range(1)] = None,
        group_init: Literal["independent", "copy"] = "independent",
        **conv_options: Any,
    ):
        check_call(RevGNN, locals())
        self.check_options({**locals(), **conv_options})
        super().__init__()
        make = self._setup(
            in_channels,
            hidden_channels,
            out_channels,
            num_layers,
            conv,
            edge_channels,
            species_channels,
            dropout,
            norm,
            conv_options,
        )
        self.weight_tied = weight_tied
        self.layers = reversible_layers(
            lambda: make(hidden_channels // num_groups),
            hidden_channels,
            num_groups,
            num_layers,
            weight_tied,
            reversible,
            keep_every,
            quantize,
            group_init,
        )

    def reset_parameters(self) -> None:
        for module in (self.node_encoder, self.edge_encoder, self.head):
            if module is not None:
                module.reset_parameters()
        self.layers.reset_parameters()

    def forward(self, x: Tensor, edge_index: Adj, edge_attr: OptTensor = None) -> Tensor:
        h, edge_index, edges = self._encode(x, edge_index, edge_attr)
        mask, scale = self._dropout_mask(h)
        return self.head(self.layers(h, edge_index, edges, mask, **scale))

    def __repr__(self) -> str:
        return reversible_repr(self)


@register_model(
    RevGNN,
    dataset="ogbn-proteins",
    num_parameters=20_031_384,
    paper=LI_2021,
    reported=[
        Reported(
            "RevGNN-Deep",
            "test ROC-AUC",
            87.74,
            0.13,
            source="Li et al. 2021, ogbn-proteins results",
            experiment="proteins_revgnn_deep",
        )
    ],
)
def revgnn_deep() -> Dict[str, Any]:
    """RevGNN-Deep: 1001 reversible GENConv-max blocks x 80 channels, 2 groups, dropout 0.1."""
    return dict(
        PROTEINS, num_layers=1001, hidden_channels=80, num_groups=2, conv="gen", aggr="max", dropout=0.1
    )


@register_model(
    RevGNN,
    dataset="ogbn-proteins",
    num_parameters=68_471_608,
    paper=LI_2021,
    reported=[
        Reported(
            "RevGNN-Wide",
            "test ROC-AUC",
            88.24,
            0.15,
            source="Li et al. 2021, ogbn-proteins results",
            experiment="proteins_revgnn_wide",
        )
    ],
)
def revgnn_wide() -> Dict[str, Any]:
    """RevGNN-Wide: 448 reversible GENConv-max blocks x 224 channels, 2 groups, dropout 0.2."""
    return dict(
        PROTEINS, num_layers=448, hidden_channels=224, num_groups=2, conv="gen", aggr="max", dropout=0.2
    )


@register_model(
    RevGNN,
    dataset="ogbn-proteins",
    num_parameters=1_457_080,
    paper=LI_2021,
    reported=[
        Reported("RevGNN-64", "test ROC-AUC", 85.48, source=ABLATION_112),
        Reported(
            "RevGNN-80",
            "test ROC-AUC",
            85.97,
            source=ABLATION_112,
            overrides={"hidden_channels": 80},
            num_parameters=2_251_384,
        ),
        Reported(
            "RevGNN-224",
            "test ROC-AUC",
            87.02,
            source=ABLATION_112,
            overrides={"hidden_channels": 224},
            num_parameters=17_141_560,
            experiment="proteins_revgnn_112",
        ),
    ],
)
def revgnn_112() -> Dict[str, Any]:
    """RevGNN of the 112-layer ablation: 112 reversible GENConv-max blocks, 2 groups, dropout 0.1."""
    return dict(
        PROTEINS, num_layers=112, hidden_channels=64, num_groups=2, conv="gen", aggr="max", dropout=0.1
    )


@register_model(
    RevGNN,
    dataset="ogbn-proteins",
    num_parameters=22_072,
    paper=LI_2021,
    reported=[
        Reported("WT-RevGNN-64", "test ROC-AUC", 82.89, source=ABLATION_112),
        Reported(
            "WT-RevGNN-80",
            "test ROC-AUC",
            83.46,
            source=ABLATION_112,
            overrides={"hidden_channels": 80},
            num_parameters=31_384,
        ),
        Reported(
            "WT-RevGNN-224",
            "test ROC-AUC",
            85.28,
            source=ABLATION_112,
            overrides={"hidden_channels": 224},
            num_parameters=184_312,
            experiment="proteins_wt_revgnn",
        ),
    ],
)
def wt_revgnn() -> Dict[str, Any]:
    """WT-RevGNN: one reversible GENConv-max block (2 groups, dropout 0.1) applied 112 times;
    parameters do not grow with depth."""
    return dict(
        PROTEINS,
        num_layers=112,
        hidden_channels=64,
        num_groups=2,
        conv="gen",
        aggr="max",
        dropout=0.1,
        weight_tied=True,
    )


@register_model(RevGNN, dataset="ogbn-proteins", num_parameters=215_992)
def revgnn_small() -> Dict[str, Any]:
    """CPU-sized RevGNN: 16 reversible GENConv-max blocks x 64 channels, 2 groups, dropout 0.1."""
    return dict(
        PROTEINS, num_layers=16, hidden_channels=64, num_groups=2, conv="gen", aggr="max", dropout=0.1
    )


@register_model(RevGNN, dataset="proteins_like", num_parameters=31_800)
def revgnn_proteins_like() -> Dict[str, Any]:
    """The default model of ``revgnn-train``: 8 reversible GENConv blocks x 32 channels, 2 groups,
    mean aggregation (the generated ``proteins_like`` labels are multi-hop neighbourhood means),
    dropout 0.1."""
    return dict(
        PROTEINS, num_layers=8, hidden_channels=32, num_groups=2, conv="gen", aggr="mean", dropout=0.1
    )


@register_model(
    RevGNN,
    dataset="ogbn-products",
    num_parameters=2_945_007,
    reported=[
        Reported(
            "RevGNN-112",
            "test accuracy",
            83.07,
            0.30,
            source="PyG examples/rev_gnn.py",
            experiment="products_revgnn_112",
        )
    ],
)
def revgnn_products() -> Dict[str, Any]:
    """RevGNN for ogbn-products (PyG's example): 112 reversible SAGEConv blocks x 160 channels,
    2 groups, dropout 0.5."""
    return dict(
        in_channels=100,
        out_channels=47,
        num_layers=112,
        hidden_channels=160,
        num_groups=2,
        conv="sage",
        dropout=0.5,
    )


@register_model(
    RevGNN,
    dataset="ogbn-arxiv",
    num_parameters=145_960,
    paper=LI_2021,
    reported=[
        Reported(
            "RevGAT",
            "test accuracy",
            74.02,
            0.18,
            source="Li et al. 2021, ogbn-arxiv results",
            experiment="arxiv_revgat",
            note="3 heads, label reuse and self-distillation, which this zoo does not do",
        )
    ],
)
def revgat_arxiv() -> Dict[str, Any]:
    """Reversible GAT for ogbn-arxiv: 3 reversible GAT blocks x 256 channels in 2 groups, 2 heads
    (the heads must divide a group's 128 channels), BatchNorm inside the blocks, dropout 0.5."""
    return dict(
        in_channels=128,
        out_channels=40,
        num_layers=3,
        hidden_channels=256,
        num_groups=2,
        conv="gat",
        heads=2,
        norm="batch",
        dropout=0.5,
        attn_dropout=0.0,
    )
