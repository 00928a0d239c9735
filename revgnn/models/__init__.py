"""The model zoo: ``create_model(name, **overrides)``, ``list_models(pattern)``, ``model_info(name)``.

Importing this package registers every variant (:mod:`revgnn.models.registry`).
"""

from revgnn.models.components import count_parameters
from revgnn.models.deq_gnn import DEQGNN
from revgnn.models.graph_revgnn import GraphRevGNN
from revgnn.models.mlp import MLP
from revgnn.models.registry import (
    MODELS,
    ModelInfo,
    Reported,
    check_model_config,
    create_model,
    list_models,
    model_arguments,
    model_info,
    register_model,
)
from revgnn.models.resgnn import ResGNN
from revgnn.models.revgnn import RevGNN

__all__ = [
    "MODELS",
    "create_model",
    "list_models",
    "model_info",
    "model_arguments",
    "check_model_config",
    "register_model",
    "ModelInfo",
    "Reported",
    "count_parameters",
    "RevGNN",
    "ResGNN",
    "GraphRevGNN",
    "MLP",
    "DEQGNN",
]
