"""Building blocks to import into your own PyG models."""

from revgnn.deq import DEQ
from revgnn.nn.blocks import (
    GATBlock,
    GCNBlock,
    GENBlock,
    GINBlock,
    PreActBlock,
    Residual,
    SAGEBlock,
)
from revgnn.nn.conv_registry import CONVS, ConvSpec, conv_spec, list_convs, make_block, register_conv
from revgnn.nn.dropout import SharedDropout
from revgnn.nn.edge_features import LinearEdgeFeatures
from revgnn.nn.group_rev import GroupAddRev
from revgnn.nn.invertible import InvertibleFunction, InvertibleModule, PerGroup, Shared
from revgnn.nn.norm_act import layer_norm_relu
from revgnn.nn.tied import BlockSequence, WeightTied

__all__ = [
    "GroupAddRev",
    "Shared",
    "PerGroup",
    "LinearEdgeFeatures",
    "InvertibleModule",
    "InvertibleFunction",
    "SharedDropout",
    "WeightTied",
    "BlockSequence",
    "PreActBlock",
    "GENBlock",
    "GATBlock",
    "GCNBlock",
    "SAGEBlock",
    "GINBlock",
    "Residual",
    "CONVS",
    "ConvSpec",
    "register_conv",
    "conv_spec",
    "list_convs",
    "make_block",
    "DEQ",
    "layer_norm_relu",
]
