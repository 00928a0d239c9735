"""MLP baseline: node features only, no graph."""

from __future__ import annotations

from typing import Annotated, Any, Dict

from torch import Tensor, nn
from torch_geometric.typing import Adj, OptTensor

from revgnn.models.components import Head, NodeEncoder
from revgnn.models.paper import PROTEINS
from revgnn.models.registry import register_model
from revgnn.utils.ranges import Range
from revgnn.utils.signature import check_call


class MLP(nn.Module):
    r"""Node-wise MLP baseline: encoder, ``num_layers`` x (Linear -> LayerNorm ->
    ReLU -> Dropout), head. Ignores ``edge_index`` and ``edge_attr``; it shows
    how much of a task needs the graph.

    Args:
        in_channels (int): Node feature width.
        hidden_channels (int): Hidden width.
        out_channels (int): Output width.
        num_layers (int, optional): Hidden layers after the encoder (:obj:`0`: the encoder and the
            head alone). (default: :obj:`2`)
        species_channels (int, optional): See :class:`~revgnn.models.components.NodeEncoder`.
        dropout (float, optional): Dropout. (default: :obj:`0.0`)
        edge_channels (int, optional): Accepted for a uniform data interface;
            edge features are not used. (default: :obj:`None`)
    """

    def __init__(
        self,
        in_channels: int,
        hidden_channels: Annotated[int, Range(1)],
        out_channels: int,
        num_layers: Annotated[int, Range(0)] = 2,
        species_channels: Annotated[int, Range(0)] = 0,
        dropout: Annotated[float, Range(0, 1, high_open=True)] = 0.0,
        edge_channels: Any = None,
    ):
        check_call(MLP, locals())
        super().__init__()
        self.node_encoder = NodeEncoder(in_channels, hidden_channels, species_channels)
        self.layers = nn.ModuleList(
            [
                nn.Sequential(
                    nn.Linear(hidden_channels, hidden_channels),
                    nn.LayerNorm(hidden_channels),
                    nn.ReLU(),
                    nn.Dropout(dropout),
                )
                for _ in range(num_layers)
            ]
        )
        self.head = Head(hidden_channels, out_channels, dropout)

    def reset_parameters(self) -> None:
        self.node_encoder.reset_parameters()
        for layer in self.layers:
            for module in layer:
                if hasattr(module, "reset_parameters"):
                    module.reset_parameters()
        self.head.reset_parameters()

    def forward(self, x: Tensor, edge_index: Adj = None, edge_attr: OptTensor = None) -> Tensor:
        h = self.node_encoder(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


@register_model(MLP, dataset="ogbn-proteins", num_parameters=17_144)
def mlp() -> Dict[str, Any]:
    """MLP baseline without the graph: 2 hidden layers x 64 channels, dropout 0.1."""
    return dict(PROTEINS, num_layers=2, hidden_channels=64, dropout=0.1)
