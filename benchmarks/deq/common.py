"""What the DEQ benchmarks share: the generated graph and models (:func:`load_graph`, :func:`build`,
:func:`train_steps`), the held-out equilibrium maps ``peer`` and ``broyden-memory`` both solve
(:func:`contractive_graph_map`, :func:`deq_gnn_map`), the arms of ``train`` and ``jacobian``
(:class:`Arm`) and their command-line options with one default each (:func:`parser`)."""

from __future__ import annotations

import argparse
from typing import Optional, Sequence


def load_graph(nodes: int, seed: int = 0):
    from revgnn.data.synthetic import proteins_like

    return proteins_like(num_nodes=nodes, seed=seed)


def build(name: str, hidden: int, data, **extra):
    import revgnn.models.deq_gnn  # noqa: F401  (registers deq_gnn if models/__init__ does not yet)
    from revgnn.models import create_model

    return create_model(
        name,
        hidden_channels=hidden,
        in_channels=data.x.size(1),
        out_channels=data.num_classes,
        edge_channels=data.edge_attr.size(1),
        species_channels=data.species_channels,
        **extra,
    )


def train_steps(model, data, steps: int, lr: float = 1e-3) -> None:
    import torch

    opt = torch.optim.Adam(model.parameters(), lr=lr)
    idx = data.split_idx["train"]
    for _ in range(steps):
        opt.zero_grad()
        out = model(data.x, data.edge_index, data.edge_attr)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(out[idx], data.y[idx])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()


def contractive_graph_map(nodes: int, d: int = 16, kappa: float = 0.9, seed: int = 1234):
    """z -> tanh(A z W + b) with a symmetric-normalised random graph A (self loops) and ||W||_2 = kappa:
    a kappa-contraction in the 2-norm; float64. The seed is not one the tests use (held out)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, nodes, (8 * nodes,), generator=g)
    dst = torch.randint(0, nodes, (8 * nodes,), generator=g)
    loops = torch.arange(nodes)
    ei = torch.cat([torch.stack([src, dst]), torch.stack([dst, src]), torch.stack([loops, loops])], 1)
    ei = torch.unique(ei, dim=1)
    deg = torch.zeros(nodes, dtype=torch.float64).index_add_(
        0, ei[1], torch.ones(ei.size(1), dtype=torch.float64)
    )
    val = deg[ei[0]].rsqrt() * deg[ei[1]].rsqrt()
    A = torch.sparse_coo_tensor(ei.flip(0), val, (nodes, nodes)).coalesce().to_sparse_csr()
    W = torch.randn(d, d, generator=g, dtype=torch.float64)
    W = torch.nn.Parameter(kappa * W / torch.linalg.matrix_norm(W, 2))
    b = torch.nn.Parameter(torch.randn(nodes, d, generator=g, dtype=torch.float64))

    def f(z):
        return torch.tanh(A @ (z @ W) + b)

    return f, torch.zeros(nodes, d, dtype=torch.float64), [W, b]


def deq_gnn_map(nodes: int, seed: int = 0):
    """deq_gnn_small's equilibrium map on proteins_like, untrained, float64, evaluation mode."""
    import torch

    from revgnn.nn.graph_input import sort_edges

    data = load_graph(nodes)
    torch.manual_seed(seed)
    model = build("deq_gnn_small", 32, data).double().eval()
    ei, ea = sort_edges(data.edge_index, data.edge_attr.double(), data.x.size(0))
    with torch.no_grad():
        h = model.node_encoder(data.x.double())

    def f(z):
        return model.layer(z, h, ei, ea)

    return f, torch.zeros_like(h), list(model.layer.parameters())


#: Short names of the model keys an arm sets, for its folder name (``w0.5_s3``, ``rw10_rt0.6_s3``).
_ARM_KEYS = {"jac_reg_weight": "w", "spectral_reg_weight": "rw", "spectral_reg_target": "rt"}
_REGULARISERS = ("jac_reg_weight", "spectral_reg_weight")


class Arm:
    """One arm of ``train``: model overrides ``key=value[,key=value]``, e.g. ``jac_reg_weight=0.5`` or
    ``spectral_reg_weight=10,spectral_reg_target=0.6``; ``none`` is the unregularised model."""

    def __init__(self, spec: str):
        self.label = spec
        self.model = {}
        for item in [] if spec == "none" else spec.split(","):
            key, sep, value = item.partition("=")
            if not sep or not key or not value:
                raise argparse.ArgumentTypeError(f"arm {spec!r}: expected key=value[,key=value] or none")
            self.model[key.strip()] = value.strip()
        for key in _REGULARISERS:
            if key in self.model:
                try:
                    float(self.model[key])
                except ValueError:
                    raise argparse.ArgumentTypeError(f"arm {spec!r}: {key} must be a number") from None

    @property
    def regularised(self) -> bool:
        return any(float(self.model.get(k, 0)) > 0 for k in _REGULARISERS)

    @property
    def folder(self) -> str:
        if not self.model:
            return "w0"
        return "_".join(f"{_ARM_KEYS.get(k, k)}{v}" for k, v in self.model.items())

    def overrides(self, jac_every: int):
        out = [f"model.jac_reg_weight={self.model.get('jac_reg_weight', 0.0)}"]
        # it acts only with a weight: the unregularised arm's configuration is one for every --jac-every
        out.append(f"model.jac_reg_every={jac_every if self.regularised else 1}")
        out += [f"model.{k}={v}" for k, v in self.model.items() if k != "jac_reg_weight"]
        return out


#: The options more than one DEQ benchmark takes, each with its one default: name -> argparse keywords.
OPTIONS = {
    "--nodes": dict(type=int, default=4000),
    "--hidden": dict(type=int, default=64),
    "--threads": dict(type=int, default=2),
    "--seeds": dict(type=int, default=3),
    "--tol": dict(type=float, default=1e-4),
    "--max-iter": dict(type=int, default=300),
    "--arms": dict(
        type=Arm,
        nargs="+",
        default=[Arm("none"), Arm("jac_reg_weight=1")],
        help="model overrides of each arm, key=value[,key=value] (e.g. jac_reg_weight=0.5 or "
        "spectral_reg_weight=10,spectral_reg_target=0.6), or none",
    ),
    "--seeds-list": dict(type=int, nargs="+", default=[0, 1], help="run seeds"),
}


def parser(doc: str, prog: Optional[str], options: Sequence[str], **helps: str) -> argparse.ArgumentParser:
    """A benchmark's parser: its description the first paragraph of ``doc`` (the module docstring),
    the shared ``options`` of :data:`OPTIONS` by name, ``helps`` their help text in this benchmark
    (keyed ``max_iter`` for ``--max-iter``). The benchmark adds its own options to it."""
    p = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0])
    for name in options:
        kwargs = dict(OPTIONS[name])
        key = name[2:].replace("-", "_")
        if key in helps:
            kwargs["help"] = helps[key]
        p.add_argument(name, **kwargs)
    return p
