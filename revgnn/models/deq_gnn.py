r"""DEQ-GNN (Li et al., ICML 2021, Section 5): a GNN of "infinite depth" evaluated at an equilibrium."""

from __future__ import annotations

import difflib
import inspect
import math
from typing import Annotated, Any, Dict, Mapping, Optional, Tuple

import torch
from torch import Tensor, nn
from torch_geometric.typing import Adj, OptTensor

from revgnn.deq import DEQ
from revgnn.models.components import (
    Head,
    NodeEncoder,
    block_builder,
    check_conv_options,
    conv_of,
    conv_parameters,
    make_edge_encoder,
)
from revgnn.models.paper import ABLATION_112, LI_2021, PROTEINS
from revgnn.models.registry import Reported, register_model
from revgnn.nn import LinearEdgeFeatures, SharedDropout, conv_spec
from revgnn.nn.graph_input import SortedEdges, check_features, sort_edges
from revgnn.utils.functional import plain_operators
from revgnn.utils.ranges import Range
from revgnn.utils.signature import check_call, check_types, keyword_parameters, with_defaults

__all__ = ["DEQGNNLayer", "DEQGNN", "deq_gnn", "deq_gnn_small"]

#: DEQ parameters the model sets itself: the map, and the unrolled depth from ``pretrain_depth``.
_SET_BY_MODEL = ("f", "unroll_steps")
#: Aggregations whose Lipschitz constant in the max-norm is at most 1 (needed by ``contraction``).
_CONTRACTIVE_AGGRS = ("max", "mean")


def _gen_keys_before_registry(state_dict, prefix, *_) -> None:
    """Renames, in place, the keys of a GEN :class:`DEQGNNLayer` saved before its convs were registry
    blocks: ``conv_edge_encoders.k.*`` is now ``convs.k.edge_encoder.*`` and ``convs.k.*`` (the
    GENConv) ``convs.k.conv.*``, so those checkpoints load."""
    for key in [k for k in state_dict if k.startswith(prefix)]:
        parts = key[len(prefix) :].split(".")
        if parts[0] == "conv_edge_encoders":
            new = ["convs", parts[1], "edge_encoder", *parts[2:]]
        elif parts[0] == "convs" and len(parts) > 2 and parts[2] not in ("conv", "edge_encoder"):
            new = ["convs", parts[1], "conv", *parts[2:]]
        else:
            continue
        state_dict[prefix + ".".join(new)] = state_dict.pop(key)


class DEQGNNLayer(nn.Module):
    r"""The equilibrium map of DEQ-GNN (Li et al., 2021),

    .. math::
        \mathbf{Z}'   &= \mathrm{Conv}_1(\mathbf{Z}), \qquad
        \mathbf{Z}''  = \mathrm{Norm}_1(\mathbf{Z}' + \mathbf{X}),

        \mathbf{Z}''' &= \mathrm{Conv}_2(\mathbf{M} \odot \mathrm{ReLU}(\mathbf{Z}'')), \qquad
        f(\mathbf{Z}, \mathbf{X}) = \mathrm{Norm}_2(\mathrm{ReLU}(\mathbf{Z}''' + \mathbf{Z}')),

    where :math:`\mathbf{X}` is the injected (encoded) input, :math:`\mathbf{M}` a dropout mask drawn once
    per forward pass and held fixed across solver iterations, each Conv a block of the registered
    ``conv`` without pre-activation (:func:`~revgnn.nn.register_conv`; its options in
    ``**conv_options``), and Norm a LayerNorm. The paper's, the default, is
    :class:`~revgnn.nn.GENBlock`: a :class:`~torch_geometric.nn.conv.GENConv` (2-layer MLP
    :math:`c \to 2c \to c` with LayerNorm, biases) with its own edge encoder
    :math:`\mathbf{W}_k \in \mathbb{R}^{c \times c}` on top of the shared encoder :math:`\mathbf{W}_e`
    of the raw edge features :math:`\mathbf{a}_{ji}`.
    The two linear maps are applied as one, :math:`\mathbf{e}^{(k)}_{ji} = (\mathbf{W}_k\mathbf{W}_e)
    \mathbf{a}_{ji} + \mathbf{W}_k\mathbf{b}_e + \mathbf{b}_k`, inside the map: no
    :math:`|\mathcal{E}| \times c` edge embedding is kept for the backward pass (only the raw
    :math:`|\mathcal{E}| \times 8` features), at the price of a small :math:`8 \to c` product per
    evaluation. The parameters are exactly those of the paper's model.

    **Contraction guarantee.** LayerNorm has no useful Lipschitz bound, so with
    :obj:`contraction` :math:`=\kappa < 1` the norms (also the one inside each MLP) are dropped and,
    before every forward pass, every MLP weight is rescaled row-wise onto
    :math:`\|\mathbf{W}\|_\infty \le r` (IGNN-style projected gradient descent, Gu et al., 2020). In the
    max-norm over all node features, each GENConv is then :math:`c = 2r^2`-Lipschitz (the root term and a
    max/mean aggregation of :math:`\mathrm{ReLU}(\mathbf{z}_j + \mathbf{e}_{ji})` each contribute 1), the
    mask at most :math:`1/(1-p)`, so

    .. math::
        \mathrm{Lip}(f) \le c\left(1 + \frac{c}{1-p}\right) = \kappa
        \quad\text{for}\quad c = \frac{1-p}{2}\left(\sqrt{1 + \frac{4\kappa}{1-p}} - 1\right):

    :math:`f` is a contraction, the fixed point exists, is unique, and plain iteration reaches it from
    any start (Banach).

    Args:
        channels (int): Hidden width :math:`c`.
        edge_channels (int, optional): Width of the raw edge features; :obj:`None` for graphs without
            edge features. (default: :obj:`None`)
        conv (str, optional): The registered conv of both Convs. (default: :obj:`"gen"`)
        dropout (float, optional): Dropout probability :math:`p` (used only for the contraction bound;
            the mask itself is an input). (default: :obj:`0.0`)
        contraction (float, optional): Lipschitz bound :math:`\kappa \in (0, 1)` to enforce (``gen``
            only), or :obj:`None`. (default: :obj:`None`)
        **conv_options: Options of the conv's block (e.g. ``aggr``, ``learn_t`` of ``gen``), checked
            against its signature.
    """

    def __init__(
        self,
        channels: int,
        edge_channels: Optional[int] = None,
        conv: str = "gen",
        dropout: Annotated[float, Range(0, 1, high_open=True)] = 0.0,
        contraction: Annotated[Optional[float], Range(0, 1, low_open=True, high_open=True)] = None,
        **conv_options: Any,
    ):
        check_call(DEQGNNLayer, locals())
        self.check_options({**locals(), **conv_options})
        super().__init__()
        self.channels, self.conv = channels, conv
        self.contraction = contraction
        self.dropout = dropout
        if contraction is not None:  # LayerNorm has no Lipschitz bound: none inside the MLPs either
            conv_options = {**conv_options, "mlp_norm": False}
        make = block_builder(conv, None, channels if edge_channels else None, **conv_options)
        self.edge_encoder = make_edge_encoder(edge_channels, channels, make.uses_edges)
        self.convs = nn.ModuleList([make(channels, preact=False) for _ in range(2)])
        self.norms = nn.ModuleList(
            [nn.LayerNorm(channels) if contraction is None else nn.Identity() for _ in range(2)]
        )
        if contraction is not None:
            q = 1.0 - dropout
            conv_lip = 0.5 * q * (math.sqrt(1.0 + 4.0 * contraction / q) - 1.0)
            self.row_bound = math.sqrt(conv_lip / 2.0)  # r: every MLP weight gets ||W||_inf <= r
        self.reset_parameters()
        if conv == "gen":
            self._register_load_state_dict_pre_hook(_gen_keys_before_registry)

    @classmethod
    def forwarded_options(
        cls, arguments: Mapping[str, Any], prefix: str = ""
    ) -> Tuple[Dict[str, inspect.Parameter], str]:
        """The parameters ``**conv_options`` may hold: those of the conv's block but what the map
        sets (:func:`~revgnn.models.components.conv_parameters`)."""
        return conv_parameters(cls, arguments, prefix), f"conv {conv_of(cls, arguments)!r}"

    @classmethod
    def check_options(cls, arguments: Mapping[str, Any], prefix: str = "") -> None:
        """What the annotations cannot say, for constructor ``arguments`` (unset ones keep their
        defaults; the model's ``hidden_channels`` counts as ``channels``): the conv options fit the
        conv's block (:func:`~revgnn.models.components.check_conv_options`), and :obj:`contraction`
        holds for the GENConv map only (its Lipschitz bound), with a 1-Lipschitz aggregation
        (``max`` or ``mean``) and the MLP norms the model removes. ``prefix`` goes before every key an
        error names. Raises :class:`ValueError`."""
        arguments = with_defaults(cls, arguments)
        channels = arguments.get("hidden_channels", arguments.get("channels"))
        check_conv_options(cls, {**arguments, "hidden_channels": channels}, prefix)
        conv, contraction = arguments["conv"], arguments["contraction"]
        if contraction is None:
            return
        if conv != "gen":
            raise ValueError(f"{prefix}contraction is derived for {prefix}conv='gen' only, got {conv!r}")
        aggr = arguments.get("aggr", conv_parameters(cls, arguments)["aggr"].default)
        if aggr not in _CONTRACTIVE_AGGRS:
            raise ValueError(
                f"{prefix}contraction needs {prefix}aggr in {_CONTRACTIVE_AGGRS} (1-Lipschitz), got {aggr!r}"
            )
        if "mlp_norm" in arguments:
            raise ValueError(
                f"{prefix}contraction removes the MLP's norm; {prefix}mlp_norm is set by the model"
            )

    def reset_parameters(self) -> None:
        # every conv's own edge encoder before the convs themselves: a seed then gives the weights of
        # the layout before convs were chosen by name (W_1, W_2, then the two GENConvs)
        encoders = [
            block.edge_encoder for block in self.convs if getattr(block, "edge_encoder", None) is not None
        ]
        rest = [m for block in self.convs for m in block.children() if all(m is not e for e in encoders)]
        for module in [self.edge_encoder, *encoders, *rest, *self.norms]:
            if hasattr(module, "reset_parameters"):
                module.reset_parameters()
        self.project_()

    def mlp_weights(self):
        """The weights of the GENConvs' MLPs (what :obj:`contraction` bounds)."""
        for block in self.convs:
            for module in block.conv.mlp:
                if hasattr(module, "weight"):
                    yield module.weight

    @torch.no_grad()
    def project_(self) -> None:
        r"""Rescale each MLP weight row-wise to :math:`\|\mathbf{W}\|_\infty \le r` (no-op without
        :obj:`contraction`). Called by :class:`DEQGNN` before every forward pass."""
        if self.contraction is None:
            return
        for w in self.mlp_weights():
            row_sums = w.abs().sum(dim=1, keepdim=True)
            w.mul_(torch.clamp(self.row_bound / row_sums.clamp_min(1e-30), max=1.0))

    def edge_features(self, edge_attr: OptTensor):
        r"""The shared edge embedding :math:`\mathbf{W}_e\mathbf{a} + \mathbf{b}_e` of the raw features
        :math:`\mathbf{a}` that both convs receive (each applies its own encoder :math:`\mathbf{W}_k`);
        in factored form for a conv registered with ``factored_edges``
        (:class:`~revgnn.nn.LinearEdgeFeatures`: the aggregation kernel never expands it)."""
        if edge_attr is None or self.edge_encoder is None:
            return None
        if conv_spec(self.conv).factored_edges:
            return LinearEdgeFeatures.from_linear(edge_attr, self.edge_encoder)
        return self.edge_encoder(edge_attr)

    def forward(
        self,
        z: Tensor,
        x: Tensor,
        edge_index: Adj,
        edge_attr: OptTensor = None,
        mask: Optional[Tensor] = None,
    ) -> Tensor:
        r"""
        Args:
            z (Tensor): State :math:`\mathbf{Z}`, :math:`[N, c]`.
            x (Tensor): Injected input :math:`\mathbf{X}`, :math:`[N, c]`.
            edge_index (torch.Tensor or EdgeIndex): The graph.
            edge_attr (Tensor, optional): Raw edge features :math:`[E, \text{edge\_channels}]`.
            mask (Tensor, optional): Dropout mask (scaled), fixed for the whole solve.
        """
        e = self.edge_features(edge_attr)
        z1 = self.convs[0](z, edge_index, e)
        h = self.norms[0](z1 + x).relu()
        if mask is not None:
            h = h * mask
        z3 = self.convs[1](h, edge_index, e)
        return self.norms[1]((z3 + z1).relu())

    def twice_differentiable(
        self,
        z: Tensor,
        x: Tensor,
        edge_index: Adj,
        edge_attr: OptTensor = None,
        mask: Optional[Tensor] = None,
    ) -> Tensor:
        r"""The same map in plain PyTorch ops (:func:`~revgnn.utils.functional.plain_operators`), which
        can be differentiated twice, unlike the fused kernels of :meth:`forward`;
        :class:`~revgnn.deq.DEQ` uses it for the Jacobian penalties (the gradient of a
        vector-Jacobian product). Only for a plain ``edge_index`` tensor: the distributed (SAR)
        aggregation is differentiable once."""
        if not isinstance(edge_index, (Tensor, SortedEdges)):
            raise TypeError(
                "DEQGNNLayer: the Jacobian and spectral-radius penalties need the map's second derivative, "
                f"which the {type(edge_index).__name__} aggregation does not provide (only a plain "
                "edge_index tensor does); train with jac_reg_weight=0 and spectral_reg_weight=0 on this graph"
            )
        with plain_operators():
            return self(z, x, edge_index, edge_attr, mask)

    def __repr__(self) -> str:
        extra = f", contraction={self.contraction}" if self.contraction is not None else ""
        return (
            f"{self.__class__.__name__}({self.channels}, {self.convs[0]!r}, "
            f"edges={self.edge_encoder is not None}{extra})"
        )


class DEQGNN(nn.Module):
    r"""DEQ-GNN from `"Training Graph Neural Networks with 1000 Layers"
    <https://arxiv.org/abs/2106.07476>`_: one weight-tied :class:`DEQGNNLayer` applied "infinitely"
    often, i.e. evaluated at its fixed point by a root solver and differentiated implicitly,

    .. math::
        \mathbf{X} = \mathrm{NodeEncoder}(\mathbf{X}_{in}), \qquad
        \mathbf{Z}^* = f_\theta(\mathbf{Z}^*, \mathbf{X}), \qquad
        \mathbf{Y} = \mathrm{Linear}(\mathrm{Dropout}(\mathrm{ReLU}(\mathrm{LayerNorm}(\mathbf{Z}^*)))).

    What is kept for the backward pass is :math:`\mathbf{Z}^*` and the map's inputs (node and raw edge
    features, dropout mask), whatever the number of solver iterations: the backward pass re-evaluates the
    map once and solves the adjoint equation (see :class:`~revgnn.deq.DEQ`).

    **Unrolled pretraining.** With :obj:`pretrain_epochs` :math:`= E > 0` the model first trains as a
    :obj:`pretrain_depth`-layer weight-tied network (plain backprop through the unrolled iterations from
    :math:`\mathbf{Z}_0 = \mathbf{0}`), then switches to equilibrium mode. The training loop calls
    :meth:`set_epoch` at the start of every epoch (a no-op for :obj:`pretrain_epochs=0`); :attr:`phase`
    tells which mode is active. Solver statistics of the last forward/backward pass (steps, residual,
    converged) are in :meth:`deq_stats`, ready to log.

    Args:
        in_channels (int): Node feature width.
        hidden_channels (int): Hidden width.
        out_channels (int): Output width.
        edge_channels (int, optional): Raw edge feature width (:obj:`None`: no edge features).
            (default: :obj:`None`)
        species_channels (int, optional): Trailing one-hot node columns with their own encoder
            (proteins: 8). (default: :obj:`0`)
        conv (str, optional): The registered conv of the map's two Convs (see
            :class:`DEQGNNLayer`). (default: :obj:`"gen"`)
        dropout (float, optional): Dropout inside the map (one mask per forward pass) and in the head.
            (default: :obj:`0.0`)
        pretrain_epochs (int, optional): Epochs of unrolled weight-tied pretraining. (default: :obj:`0`)
        pretrain_depth (int, optional): Unrolled depth during pretraining (the DEQ's
            ``unroll_steps``). (default: :obj:`8`)
        contraction (float, optional): Enforce :math:`\mathrm{Lip}(f) \le \kappa` (see
            :class:`DEQGNNLayer`). (default: :obj:`None`)
        **options: Options of the conv's block (e.g. ``aggr``, ``learn_t`` of ``gen``) and of the
            equilibrium, forwarded to :class:`~revgnn.deq.DEQ`, each checked against the signature
            it goes to (:meth:`forwarded_options`; the DEQ's: every parameter but ``f`` and
            ``unroll_steps``, with its defaults): the solver (``solver``, ``max_iter``, ``tol``,
            ``stop_mode``, ``solver_options``, ``eval_max_iter``, ``warm_start``), the gradient
            (``backward``, the ``backward_*`` settings, ``phantom_steps``, ``phantom_damping``), the
            Jacobian terms (``jac_reg_*``, ``spectral_*``) and the fixed-point correction
            (``correction_*``; added by :meth:`auxiliary_loss`).
    """

    def __init__(
        self,
        in_channels: int,
        hidden_channels: Annotated[int, Range(1)],
        out_channels: int,
        edge_channels: Optional[int] = None,
        species_channels: Annotated[int, Range(0)] = 0,
        conv: str = "gen",
        dropout: Annotated[float, Range(0, 1, high_open=True)] = 0.0,
        pretrain_epochs: Annotated[int, Range(0)] = 0,
        pretrain_depth: Annotated[int, Range(1)] = 8,
        contraction: Annotated[Optional[float], Range(0, 1, low_open=True, high_open=True)] = None,
        **options: Any,
    ):
        check_call(DEQGNN, locals())
        conv_options = {k: v for k, v in options.items() if k in conv_parameters(DEQGNN, {"conv": conv})}
        deq_options = {k: v for k, v in options.items() if k not in conv_options}
        params, _ = self.forwarded_options({"conv": conv})
        unknown = [k for k in deq_options if k not in params]
        if unknown:  # neither the DEQ's nor the conv's
            close = difflib.get_close_matches(unknown[0], list(params), n=1)
            raise TypeError(
                f"DEQGNN has no option(s) {', '.join(unknown)}"
                + (f" (did you mean {close[0]}?)" if close else "")
                + f"; its DEQ takes {', '.join(keyword_parameters(DEQ, skip=_SET_BY_MODEL))}; its conv "
                f"{conv!r} takes {', '.join(conv_spec(conv).options) or 'no options'}"
            )
        check_types(params, options)
        self.check_options({**locals(), **options})
        super().__init__()
        self.node_encoder = NodeEncoder(in_channels, hidden_channels, species_channels)
        self.dropout = SharedDropout(dropout)
        layer = DEQGNNLayer(hidden_channels, edge_channels, conv, dropout, contraction, **conv_options)
        self.deq = DEQ(layer, unroll_steps=pretrain_depth, **deq_options)
        self.head = Head(hidden_channels, out_channels, dropout)
        self.equilibrium_backward = self.deq.backward
        self.pretrain_epochs = pretrain_epochs
        self.set_epoch(0)

    @classmethod
    def forwarded_options(
        cls, arguments: Mapping[str, Any], prefix: str = ""
    ) -> Tuple[Dict[str, inspect.Parameter], str]:
        """The parameters ``**options`` may hold: :class:`~revgnn.deq.DEQ`'s but those the model
        sets (the map ``f``, ``unroll_steps`` from ``pretrain_depth``), then those of the conv's block
        (:func:`~revgnn.models.components.conv_parameters`). A name in both would be ambiguous: an
        error."""
        deq = keyword_parameters(DEQ, skip=_SET_BY_MODEL)
        conv = conv_parameters(cls, arguments, prefix)
        both = sorted(set(deq) & set(conv))
        if both:
            raise TypeError(f"DEQGNN: option(s) {', '.join(both)} would go to both the DEQ and the conv")
        return {**deq, **conv}, f"the DEQ (revgnn.deq.DEQ) and conv {conv_of(cls, arguments)!r}"

    @classmethod
    def check_options(cls, arguments: Mapping[str, Any], prefix: str = "") -> None:
        """What the annotations of the model, its layer and the DEQ cannot say, for constructor
        ``arguments`` (the model's and the conv and DEQ options it forwards; unset ones keep their
        defaults):
        :meth:`DEQGNNLayer.check_options` and :meth:`~revgnn.deq.DEQ.check_options` (the solvers'
        options, ``correction_states`` within the solve). The check before a run starts calls it
        without building anything (:func:`revgnn.models.check_model_config`); ``prefix`` goes before
        every key an error names."""
        arguments = with_defaults(cls, arguments)
        DEQGNNLayer.check_options(arguments, prefix)
        DEQ.check_options(arguments, prefix)

    @property
    def layer(self) -> DEQGNNLayer:
        return self.deq.f

    @property
    def phase(self) -> str:
        r""":obj:`"pretrain"` (unrolled weight-tied) or :obj:`"equilibrium"`."""
        return "pretrain" if self.deq.backward == "unroll" and self.pretrain_epochs else "equilibrium"

    def set_epoch(self, epoch: int) -> None:
        r"""Selects the mode for :obj:`epoch` (0-based): unrolled weight-tied for
        :obj:`epoch < pretrain_epochs`, equilibrium afterwards. Call at the start of every epoch."""
        pretrain = epoch < self.pretrain_epochs
        self.deq.backward = "unroll" if pretrain else self.equilibrium_backward

    def deq_stats(self) -> Dict[str, float]:
        r"""Solver statistics of the last pass (:obj:`forward_steps`, :obj:`forward_residual`,
        :obj:`forward_converged`, and the same with :obj:`backward_` after a backward pass)."""
        return dict(self.deq.stats)

    def reset_parameters(self) -> None:
        self.node_encoder.reset_parameters()
        self.head.reset_parameters()
        self.deq.reset_parameters()

    def forward(self, x: Tensor, edge_index: Adj, edge_attr: OptTensor = None) -> Tensor:
        check_features(next(self.parameters()), x=x, edge_attr=edge_attr)
        edge_index, edge_attr = sort_edges(edge_index, edge_attr, x.size(0))  # CSR once per pass
        h = self.node_encoder(x)
        mask = self.dropout(h)  # one mask, fixed across all solver iterations
        self.layer.project_()
        z = self.deq(h, edge_index, edge_attr, mask)
        return self.head(z)

    def auxiliary_loss(self, output_loss) -> Optional[Tensor]:
        r"""Fixed-point correction of the last training forward, :math:`\sum_i w_i\,
        \ell(\mathrm{head}(\hat{\mathbf{Z}}_i))` with :obj:`output_loss` as :math:`\ell`, or :obj:`None`
        (the DEQ's Jacobian term comes from :meth:`revgnn.deq.DEQ.auxiliary_loss`). The training loop
        calls it after every forward (:func:`revgnn.engine.loop.model_auxiliary_loss`)."""
        states = self.deq.correction_states()
        if not states:
            return None
        return sum(w * output_loss(self.head(z)) for w, z in states)

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}({self.layer}, solver={self.deq.solver}, "
            f"backward={self.equilibrium_backward}, phase={self.phase})"
        )


@register_model(
    DEQGNN,
    dataset="ogbn-proteins",
    num_parameters=51_384,
    paper=LI_2021,
    reported=[
        Reported("DEQ-GNN-64", "test ROC-AUC", 83.17, source=ABLATION_112, paper_parameters="51.3K"),
        Reported(
            "DEQ-GNN-224",
            "test ROC-AUC",
            85.84,
            source=ABLATION_112,
            overrides={"hidden_channels": 224},
            num_parameters=537_784,
            paper_parameters="537K",
            experiment="proteins_deq_gnn",
            note="the solver settings and pretraining schedule are ours; the authors released no DEQ code",
        ),
    ],
)
def deq_gnn() -> Dict[str, Any]:
    """DEQ-GNN: the paper's GENConv-max equilibrium map x 64 channels, dropout 0.1, Anderson forward
    solve (30 iterations, relative tolerance 1e-4), implicit backward."""
    return dict(
        PROTEINS, hidden_channels=64, aggr="max", dropout=0.1, solver="anderson", max_iter=30, tol=1e-4
    )


@register_model(DEQGNN, dataset="ogbn-proteins", num_parameters=15_544)
def deq_gnn_small() -> Dict[str, Any]:
    """CPU-sized DEQ-GNN for smoke runs: 32 channels, 20 Anderson iterations to 1e-3."""
    return dict(
        PROTEINS, hidden_channels=32, aggr="max", dropout=0.1, solver="anderson", max_iter=20, tol=1e-3
    )
