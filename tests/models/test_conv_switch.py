"""Switching the conv of a variant: the variant's conv options belong to its conv; another conv starts
from its own defaults (issue #31), through create_model and a model config alike."""

import pytest
import torch

from revgnn.errors import ConfigError
from revgnn.models import create_model
from revgnn.models.registry import CONFIG_TARGET, check_model_config

SMALL = dict(num_layers=2, hidden_channels=8, in_channels=8, species_channels=0, out_channels=3)


def first_conv(model):
    return model.layers[0].convs[0].conv


@pytest.mark.parametrize("conv, cls, aggr", [("gat", "GATConv", "add"), ("sage", "SAGEConv", "mean")])
def test_another_conv_starts_from_its_own_defaults(conv, cls, aggr):
    model = create_model("revgnn_small", conv=conv, **SMALL)  # the variant's own aggr='max' is GEN's
    assert type(first_conv(model)).__name__ == cls and first_conv(model).aggr == aggr
    x, edge_index = torch.randn(10, 8), torch.randint(0, 10, (2, 30))
    assert model(x, edge_index, torch.randn(30, 8)).shape == (10, 3)


def test_the_variant_keeps_its_conv_options_for_its_own_conv_and_takes_explicit_ones():
    assert first_conv(create_model("revgnn_small", **SMALL)).aggr == "max"
    assert first_conv(create_model("revgnn_small", conv="gen", **SMALL)).aggr == "max"
    assert first_conv(create_model("revgnn_small", conv="sage", aggr="max", **SMALL)).aggr == "max"
    with pytest.raises(TypeError, match=r"no argument\(s\) 'aggr'.*options of conv 'gat': heads"):
        create_model("revgnn_small", conv="gat", aggr="max")


def test_a_model_config_switching_the_conv_is_checked_the_same_way():
    """What ``revgnn-train model=revgnn_small model.conv=...`` checks before building."""
    check_model_config({"_target_": CONFIG_TARGET, "name": "revgnn_small", "conv": "gat"})
    check_model_config({"_target_": CONFIG_TARGET, "name": "revgnn_small", "conv": "sage", "aggr": "mean"})
    with pytest.raises(ConfigError, match=r"'model.aggr'"):
        check_model_config({"_target_": CONFIG_TARGET, "name": "revgnn_small", "conv": "gat", "aggr": "max"})
