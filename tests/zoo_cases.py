"""The zoo models as test cases, for the tests of PyTorch 2's entry points on them
(``models/test_torch2.py``, ``models/test_compile.py``): the zoo's names, one model per code path,
a model with inputs of its data's shapes, and a gradient comparison."""

import torch

from revgnn.models import create_model, list_models, model_info

#: The zoo's own variants (tests may register others).
ZOO = [name for name in list_models() if model_info(name).cls.__module__.startswith("revgnn.")]
# one model per code path (the zoo's other models differ from one of these in sizes only): no graph,
# fused GEN max (residual, reversible, weight-tied, DEQ), PyG's GEN mean, SAGE, GAT + BatchNorm, and
# the graph-level model (GraphNorm, softmax aggregation, readout)
PATHS = [
    "mlp",
    "resgnn_small",
    "revgnn_small",
    "wt_revgnn",
    "deq_gnn_small",
    "revgnn_proteins_like",
    "revgnn_products",
    "revgat_arxiv",
    "revgnn_mol_small",
]


def gradients_equal(got, expected, rtol=1e-10):
    """Every gradient of ``expected`` (name -> tensor) matched by ``got``'s within ``rtol`` of its own
    norm, the norm floored at 1e-6 of the whole gradient's (a bias before a LayerNorm has a gradient
    of rounding size only)."""
    whole = sum(g.square().sum() for g in expected.values()).sqrt().item()
    for k, g in expected.items():
        assert got[k] is not None, k
        assert (got[k] - g).norm().item() <= rtol * max(g.norm().item(), 1e-6 * whole), k


def zoo_case(name, dtype=torch.float64, n=40, e=160, seed=0):
    """The registered model ``name`` (2 layers where it has a depth) and inputs of its data's shapes."""
    info = model_info(name)
    model = create_model(name, **({"num_layers": 2} if "num_layers" in info.defaults else {})).to(dtype)
    g = torch.Generator().manual_seed(seed)
    d = info.defaults
    edge_index = torch.randint(0, n, (2, e), generator=g)
    if type(getattr(model, "node_encoder", None)).__name__ == "AtomEncoder":  # OGB's categorical features
        from ogb.utils.features import get_atom_feature_dims, get_bond_feature_dims

        x = torch.stack([torch.randint(0, k, (n,), generator=g) for k in get_atom_feature_dims()], 1)
        edge_attr = torch.stack([torch.randint(0, k, (e,), generator=g) for k in get_bond_feature_dims()], 1)
    else:
        x = torch.rand(n, d.get("in_channels", 16), generator=g, dtype=dtype)
        edge_attr = torch.rand(e, d.get("edge_channels", 8), generator=g, dtype=dtype)
    if info.cls.__module__ == "revgnn.models.graph_revgnn":
        return model, (x, edge_index, edge_attr, torch.arange(n) * 3 // n, 3)
    return model, (x, edge_index, edge_attr)
