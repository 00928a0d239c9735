"""Encoders and head shared by the node-level models of the zoo."""

from __future__ import annotations

import inspect
from typing import Annotated, Any, Dict, Literal, Mapping, Optional, Tuple

import torch
from torch import Tensor, nn

from revgnn.nn.graph_input import check_features, sort_edges
from revgnn.utils.ranges import Range
from revgnn.utils.signature import check_call, keyword_parameters, with_defaults


class NodeEncoder(nn.Module):
    r"""Maps raw node features to the hidden width.

    For ogbn-proteins (RevGNN recipe) the last ``species_channels`` columns are
    a species one-hot that gets its own linear map first:

    .. math::
        \mathbf{h}_i = \mathbf{W}\,[\mathbf{x}_i^{\text{edge-sum}} \,\|\,
        \mathbf{W}_s \mathbf{x}_i^{\text{species}} + \mathbf{b}_s] + \mathbf{b}

    Args:
        in_channels (int): Raw node feature width (16 for proteins: 8 summed
            edge features and an 8-way species one-hot).
        hidden_channels (int): Output width.
        species_channels (int, optional): Width of the trailing one-hot part;
            :obj:`0` for a single linear map. (default: :obj:`0`)
    """

    def __init__(self, in_channels: int, hidden_channels: int, species_channels: int = 0):
        super().__init__()
        if not 0 <= species_channels <= in_channels:
            raise ValueError(
                f"species_channels={species_channels} must be between 0 and in_channels={in_channels}"
            )
        self.in_channels = in_channels
        self.species_channels = species_channels
        self.species = nn.Linear(species_channels, species_channels) if species_channels else None
        self.lin = nn.Linear(in_channels, hidden_channels)

    def reset_parameters(self) -> None:
        if self.species is not None:
            self.species.reset_parameters()
        self.lin.reset_parameters()

    def forward(self, x: Tensor) -> Tensor:
        if x.size(-1) != self.in_channels:
            raise ValueError(
                f"the model expects {self.in_channels} node features, got "
                f"{x.size(-1)}; set in_channels to match the data"
            )
        if self.species is not None:
            s = self.species_channels
            x = torch.cat([x[:, :-s], self.species(x[:, -s:])], dim=-1)
        return self.lin(x)


class Head(nn.Module):
    r"""LayerNorm -> ReLU -> Dropout -> Linear, the output layer of RevGNN/DeeperGCN."""

    def __init__(self, hidden_channels: int, out_channels: int, dropout: float = 0.0):
        super().__init__()
        self.norm = nn.LayerNorm(hidden_channels)
        self.dropout = nn.Dropout(dropout)
        self.lin = nn.Linear(hidden_channels, out_channels)

    def reset_parameters(self) -> None:
        self.norm.reset_parameters()
        self.lin.reset_parameters()

    def forward(self, h: Tensor) -> Tensor:
        from revgnn.nn.invertible import mark_internal

        mark_internal(h)  # only this head reads the last block's output
        return self.lin(self.dropout(self.norm(h).relu()))


def make_edge_encoder(edge_channels: Optional[int], hidden_channels: int, used: bool) -> Optional[nn.Linear]:
    """``Linear(edge_channels -> hidden)`` shared by all layers, if the convs use edges."""
    return nn.Linear(edge_channels, hidden_channels) if edge_channels and used else None


def encode_edges(edge_encoder: Optional[nn.Linear], edge_attr: Optional[Tensor], conv: str):
    """The shared edge embedding handed to every block (``None`` without edges).

    For convs registered with ``factored_edges`` (GENConv blocks) it stays in factored form
    (:class:`~revgnn.nn.edge_features.LinearEdgeFeatures`), so each block's own
    edge encoder runs on the raw features; other convs get it evaluated once,
    wrapped in :class:`~revgnn.nn.Shared` so groups receive it whole.
    """
    from revgnn.nn import LinearEdgeFeatures, Shared, conv_spec

    if edge_encoder is None or edge_attr is None:
        return None
    if conv_spec(conv).factored_edges:
        return LinearEdgeFeatures.from_linear(edge_attr, edge_encoder)
    return Shared(edge_encoder(edge_attr))


def check_groups(arguments: Mapping[str, Any], prefix: str = "", conv: Optional[str] = None) -> None:
    """What no single annotation says about a model of grouped blocks, for its constructor
    ``arguments``: ``hidden_channels`` divisible by ``num_groups`` (1 without it), and, for a
    ``conv`` whose block takes ``heads`` (``gat``), the width of one group divisible by ``heads``
    (each head gets an equal share of the block's output). ``prefix`` goes before every key an
    error names. Raises :class:`ValueError`."""
    hidden, groups = arguments["hidden_channels"], arguments.get("num_groups", 1)
    if hidden % groups != 0:
        raise ValueError(f"{prefix}hidden_channels={hidden} must be divisible by {prefix}num_groups={groups}")
    if conv is None:
        return
    from revgnn.nn import conv_spec

    heads = arguments.get("heads", conv_spec(conv).defaults.get("heads", 1))
    if (hidden // groups) % heads != 0:
        if "num_groups" not in arguments:  # a model without groups (DEQGNN)
            raise ValueError(f"{prefix}heads={heads} must divide {prefix}hidden_channels={hidden}")
        raise ValueError(
            f"{prefix}heads={heads} must divide the width of a group, {prefix}hidden_channels / "
            f"{prefix}num_groups = {hidden // groups}"
        )


def reversible_layers(
    make_group_block,
    hidden_channels: Annotated[int, Range(1)],
    num_groups: Annotated[int, Range(1)],
    num_layers: Annotated[int, Range(1)],
    weight_tied: bool = False,
    reversible: bool = True,
    keep_every: Annotated[int, Range(0)] = 0,
    quantize: Annotated[Optional[int], Range(1)] = None,
    group_init: Literal["independent", "copy"] = "independent",
):
    """``num_layers`` reversible blocks of ``num_groups`` groups, called as ``layers(h, *args)``.

    ``make_group_block()`` builds the function of one group (width ``hidden_channels /
    num_groups``). Returns a :class:`~revgnn.nn.WeightTied` (one block applied ``num_layers``
    times) or a :class:`~revgnn.nn.BlockSequence`; ``reversible=False`` gives the same blocks as a
    plain stack, ``keep_every`` stores every ``keep_every``-th input to bound float32 drift,
    ``quantize`` makes every block's coupling exact and ``group_init`` says whether a block's groups
    start as copies of its first group (:class:`~revgnn.nn.GroupAddRev`).
    """
    from revgnn.nn import BlockSequence, GroupAddRev, WeightTied

    check_call(reversible_layers, locals())
    check_groups(locals())

    def rev_block(layer: int):
        keep = bool(keep_every) and layer > 0 and layer % keep_every == 0
        return GroupAddRev(
            make_group_block(),
            num_groups=num_groups,
            disable=not reversible,
            keep_input=keep,
            quantize=quantize,
            group_init=group_init,
        )

    if weight_tied:
        return WeightTied(rev_block(0), num_layers, keep_every=keep_every if reversible else 0)
    return BlockSequence(rev_block(i) for i in range(num_layers))


def first_block(layers):
    """The first (or the only, when weight-tied) block of :func:`reversible_layers`' result."""
    return layers.block if hasattr(layers, "block") else layers[0]


def reversible_repr(model: nn.Module, extra: str = "") -> str:
    """``Name(<first group block>, num_layers=L, num_groups=C<extra>[, weight_tied=True])`` for a
    model holding :func:`reversible_layers` as ``model.layers``."""
    first = first_block(model.layers)
    tied = ", weight_tied=True" if model.weight_tied else ""
    return (
        f"{model.__class__.__name__}({first.convs[0]}, num_layers={model.num_layers}, "
        f"num_groups={first.num_groups}{extra}{tied})"
    )


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters (shared tensors counted once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def conv_of(cls: type, arguments: Mapping[str, Any]) -> str:
    """The conv a model class taking ``conv`` builds for its constructor ``arguments`` (the class's
    default without one)."""
    return arguments.get("conv", keyword_parameters(cls)["conv"].default)


def conv_parameters(
    cls: type, arguments: Mapping[str, Any], prefix: str = ""
) -> Dict[str, inspect.Parameter]:
    r"""The conv options a model class taking ``conv`` and ``**conv_options`` forwards to its blocks,
    for its constructor ``arguments``: the keyword parameters of the registered block of
    :func:`conv_of` less what the model sets (``channels``, ``norm``, ``preact``,
    ``edge_channels``), with the defaults the class gives that conv in its ``conv_defaults``
    mapping (``GraphRevGNN``'s DeeperGCN softmax for ``gen``), else the block's own. An unknown
    conv is an error naming ``prefix + "conv"``."""
    from revgnn.nn import CONVS
    from revgnn.nn.conv_registry import STRUCTURAL

    conv = conv_of(cls, arguments)
    if conv not in CONVS:
        raise CONVS.unknown(conv, prefix=f"{prefix}conv: ")
    params = keyword_parameters(CONVS.get(conv).block, skip=(*STRUCTURAL, "edge_channels"))
    own = getattr(cls, "conv_defaults", {}).get(conv, {})
    return {k: p.replace(default=own[k]) if k in own else p for k, p in params.items()}


def block_options(cls: type, conv: str, options: Mapping[str, Any]) -> Dict[str, Any]:
    """The options a model class's blocks of ``conv`` are built with: the class's ``conv_defaults``
    for that conv (if any) under the given ``options``."""
    return {**getattr(cls, "conv_defaults", {}).get(conv, {}), **options}


def check_conv_options(cls: type, arguments: Mapping[str, Any], prefix: str = "") -> None:
    """For the full constructor ``arguments`` of a model class taking ``conv`` and grouped blocks:
    the conv options fit the block (:meth:`~revgnn.nn.ConvSpec.check_options`), then
    :func:`check_groups`. Raises :class:`ValueError` (:class:`TypeError` for an option's type)."""
    from revgnn.nn import conv_spec

    conv = conv_of(cls, arguments)
    spec = conv_spec(conv)
    spec.check_options({k: v for k, v in arguments.items() if k in spec.options}, prefix)
    check_groups({**block_options(cls, conv, {}), **arguments}, prefix, conv)


def block_builder(conv: str, norm: Optional[str], edge_channels: Optional[int], **options: Any):
    """Returns ``make(channels, preact=True)`` building the pre-activation block of ``conv``.

    ``conv`` is a name registered with :func:`~revgnn.nn.register_conv`; ``options`` not given
    keep the conv's own defaults, and an option the conv's constructor does not take, or a value
    its annotation does not allow, is an error rather than being ignored
    (:meth:`~revgnn.nn.ConvSpec.check_options`). ``edge_channels`` goes to convs that use edge
    features (``make.uses_edges``).
    """
    from revgnn.nn import conv_spec

    spec = conv_spec(conv)
    kwargs = dict(options)
    spec.check_options(kwargs)
    kwargs["norm"] = norm
    if spec.uses_edges:
        kwargs["edge_channels"] = edge_channels

    def make(channels: int, preact: bool = True):
        return spec.block(channels, preact=preact, **kwargs)

    make.uses_edges = spec.uses_edges
    return make


class DeepNodeGNN(nn.Module):
    """The skeleton shared by the deep node-level models: node encoder, the edge
    encoder shared by all layers, the shared dropout and the head.

    Subclasses call :meth:`_setup` in ``__init__`` (it returns the block
    builder) and :meth:`_encode` at the start of ``forward``. Their ``__init__`` takes ``conv`` and
    forwards ``**conv_options`` to its blocks; :meth:`forwarded_options` says which those are.
    """

    #: conv name -> the options this model gives its blocks unless set (none: the blocks' defaults).
    conv_defaults: Mapping[str, Mapping[str, Any]] = {}

    @classmethod
    def forwarded_options(
        cls, arguments: Mapping[str, Any], prefix: str = ""
    ) -> Tuple[Dict[str, inspect.Parameter], str]:
        """The parameters ``**conv_options`` may hold for the constructor ``arguments``
        (:func:`conv_parameters`) and whose they are, for messages."""
        return conv_parameters(cls, arguments, prefix), f"conv {conv_of(cls, arguments)!r}"

    @classmethod
    def check_options(cls, arguments: Mapping[str, Any], prefix: str = "") -> None:
        """What the annotations of the model and of its conv's block cannot say, for constructor
        ``arguments`` (the model's and the conv options it forwards; unset ones keep their defaults):
        :func:`check_conv_options`. The constructor and the check before a run starts
        (:func:`revgnn.models.check_model_config`) call it; ``prefix`` goes before every key an
        error names. Raises :class:`ValueError` (:class:`TypeError` for a conv option's type)."""
        check_conv_options(cls, with_defaults(cls, arguments), prefix)

    def _setup(
        self,
        in_channels: int,
        hidden_channels: int,
        out_channels: int,
        num_layers: int,
        conv: str,
        edge_channels: Optional[int],
        species_channels: int,
        dropout: float,
        norm: Optional[str],
        conv_options: Mapping[str, Any],
    ):
        from revgnn.nn import SharedDropout, conv_spec

        make = block_builder(conv, norm, hidden_channels if edge_channels else None, **conv_options)
        self.num_layers = num_layers
        self.conv = conv
        self.node_encoder = NodeEncoder(in_channels, hidden_channels, species_channels)
        self.edge_encoder = make_edge_encoder(edge_channels, hidden_channels, make.uses_edges)
        self.dropout = SharedDropout(dropout)
        self.compact_dropout = conv_spec(conv).compact_mask  # read once: no signature under compile
        self.head = Head(hidden_channels, out_channels, dropout)
        return make

    def _dropout_mask(self, h: Tensor) -> Tuple[Optional[Tensor], Dict[str, float]]:
        """The shared dropout mask of this forward pass and the keywords its blocks take with it:
        a bool mask and its ``dropout_scale`` where the conv's blocks take one
        (:attr:`~revgnn.nn.ConvSpec.compact_mask`; a quarter of the float mask's bytes, held for
        the whole step), else the float mask."""
        if not self.compact_dropout:
            return self.dropout(h), {}
        mask = self.dropout(h, compact=True)
        return mask, {} if mask is None else {"dropout_scale": self.dropout.scale(h.dtype)}

    def _encode(self, x: Tensor, edge_index, edge_attr: Optional[Tensor]):
        """(node embedding, destination-sorted edge index, shared edge embedding)."""
        check_features(next(self.parameters()), x=x, edge_attr=edge_attr)
        edge_index, edge_attr = sort_edges(edge_index, edge_attr, x.size(0))
        return (self.node_encoder(x), edge_index, encode_edges(self.edge_encoder, edge_attr, self.conv))
