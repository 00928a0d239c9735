"""The model zoo. ``create_model(name, **overrides)``, ``list_models(pattern)``."""

from revgnn.models.components import count_parameters
from revgnn.models.deq_gnn import DEQGNN
from revgnn.models.mlp import MLP
from revgnn.models.registry import create_model, list_models, register_model
from revgnn.models.resgnn import ResGNN
from revgnn.models.revgnn import RevGNN

__all__ = [
    "create_model",
    "list_models",
    "register_model",
    "count_parameters",
    "RevGNN",
    "ResGNN",
    "MLP",
    "DEQGNN",
]
from revgnn.models import graph_revgnn  # noqa: F401,E402  (graph-level RevGNN: registers revgnn_molhiv*)
