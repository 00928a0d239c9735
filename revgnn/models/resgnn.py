"""ResGNN: the non-reversible DeeperGCN res+ baseline (Li et al., 2020)."""

from __future__ import annotations

from typing import Annotated, Any, Dict, Optional

from torch import Tensor, nn
from torch_geometric.typing import Adj, OptTensor

from revgnn.models.components import DeepNodeGNN
from revgnn.models.paper import ABLATION_112, LI_2021, PROTEINS
from revgnn.models.registry import Reported, register_model
from revgnn.nn import Residual
from revgnn.nn.blocks import Norm
from revgnn.utils.ranges import Range
from revgnn.utils.signature import check_call


class ResGNN(DeepNodeGNN):
    r"""DeeperGCN with res+ residual connections (`"DeeperGCN: All You Need to
    Train Deeper GCNs" <https://arxiv.org/abs/2006.07739>`_), the baseline of
    the RevGNN paper (ResGNN-112 x 64 on ogbn-proteins, about 2.37M parameters).

    .. math::
        \mathbf{H}^{(1)} &= \mathrm{Conv}_1(\mathrm{NodeEncoder}(\mathbf{X}))

        \mathbf{H}^{(\ell)} &= \mathbf{H}^{(\ell-1)} + \mathrm{Conv}_\ell(
        \mathrm{Dropout}(\mathrm{ReLU}(\mathrm{Norm}(\mathbf{H}^{(\ell-1)})))),
        \quad \ell = 2, \ldots, L

    followed by the LayerNorm -> ReLU -> Dropout -> Linear head. Dropout draws a
    new mask in every layer, as in DeeperGCN. Activations of every layer are
    stored for backward: memory grows linearly with ``num_layers``.

    Args: as :class:`~revgnn.models.RevGNN` without the reversible options (``**conv_options``
    forwarded to the conv's blocks likewise).
    """

    def __init__(
        self,
        in_channels: int,
        hidden_channels: Annotated[int, Range(1)],
        out_channels: int,
        num_layers: Annotated[int, Range(1)],
        conv: str = "gen",
        edge_channels: Optional[int] = None,
        species_channels: Annotated[int, Range(0)] = 0,
        dropout: Annotated[float, Range(0, 1, high_open=True)] = 0.0,
        norm: Norm = "layer",
        **conv_options: Any,
    ):
        check_call(ResGNN, locals())
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
        self.layers = nn.ModuleList(
            [make(hidden_channels, preact=False)]
            + [Residual(make(hidden_channels)) for _ in range(num_layers - 1)]
        )

    def reset_parameters(self) -> None:
        for module in (self.node_encoder, self.edge_encoder, self.head, *self.layers):
            if module is not None:
                module.reset_parameters()

    def forward(self, x: Tensor, edge_index: Adj, edge_attr: OptTensor = None) -> Tensor:
        h, edge_index, e = self._encode(x, edge_index, edge_attr)
        h = self.layers[0](h, edge_index, e)
        for layer in self.layers[1:]:
            h = layer(h, edge_index, e, self.dropout(h))
        return self.head(h)

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.layers[0]}, num_layers={self.num_layers})"


@register_model(
    ResGNN,
    dataset="ogbn-proteins",
    num_parameters=2_374_456,
    paper=LI_2021,
    reported=[
        Reported(
            "ResGNN-112",
            "test ROC-AUC",
            85.94,
            source=ABLATION_112,
            paper_parameters="2.37M",
            experiment="proteins_resgnn_112",
        )
    ],
)
def resgnn() -> Dict[str, Any]:
    """ResGNN, the paper's non-reversible baseline: DeeperGCN res+ with 112 GENConv-max layers x 64
    channels, dropout 0.1; stores every layer's activations."""
    return dict(PROTEINS, num_layers=112, hidden_channels=64, conv="gen", aggr="max", dropout=0.1)


@register_model(ResGNN, dataset="ogbn-proteins", num_parameters=346_936)
def resgnn_small() -> Dict[str, Any]:
    """CPU-sized res+ model to compare with ``revgnn_small``: 16 GENConv-max layers x 64 channels,
    dropout 0.1."""
    return dict(PROTEINS, num_layers=16, hidden_channels=64, conv="gen", aggr="max", dropout=0.1)


@register_model(ResGNN, dataset="ogbn-proteins", num_parameters=30_136)
def gnn_1layer() -> Dict[str, Any]:
    """The shallow baseline: one GENConv-max layer x 64 channels between the encoders and the head."""
    return dict(PROTEINS, num_layers=1, hidden_channels=64, conv="gen", aggr="max", dropout=0.1)
