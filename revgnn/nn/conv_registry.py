r"""The one registry of graph convolution blocks: a conv type is registered once, by name.

A conv type is a block class :math:`f_{\mathbf{w}}` mapping ``[N, channels]`` to
``[N, channels]`` (usually a :class:`~revgnn.nn.PreActBlock`), registered with
:func:`register_conv`. Everything else is derived from the class:

* the **options** it accepts are the keyword parameters of its ``__init__``
  (:func:`make_block` and the models reject any other, naming the conv and
  what it accepts);
* it **uses edge features** when ``__init__`` takes ``edge_channels``;
* its **SAR form** is named by the registration (``sar=``): a subclass of the PyG
  conv the block holds that also runs on a
  :class:`~revgnn.distributed.sar.SARGraph`, which
  :func:`revgnn.distributed.convs.convert_to_sar` switches that conv to.

Every model takes the conv by name (``RevGNN(conv="gen")``, ``GraphRevGNN``,
``DEQGNN``, ``model.conv=gen`` in a config), and the README's conv table is
generated from this registry (:func:`conv_table`), so a new conv type is one
decorated class (and, for SAR, its SAR form beside it):

Example:
    >>> from torch_geometric.nn import GraphConv
    >>> from revgnn.nn import PreActBlock
    >>> @register_conv("graph")
    ... class GraphBlock(PreActBlock):
    ...     def __init__(self, channels, aggr="add", norm="layer", preact=True):
    ...         super().__init__(channels, norm, preact)
    ...         self.conv = GraphConv(channels, channels, aggr=aggr)
    ...
    ...     def conv_forward(self, h, edge_index, edge_attr):
    ...         return self.conv(h, edge_index)
    >>> conv_spec("graph").options
    ('aggr',)
    >>> _ = CONVS.unregister("graph")  # (keeps this example from registering it for good)
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple, Type, Union

from torch import nn

from revgnn.utils.registry import Registry
from revgnn.utils.signature import check_types, keyword_parameters

#: Constructor parameters every conv block has, set by the model rather than chosen per conv.
STRUCTURAL = ("channels", "norm", "preact")


@dataclass(frozen=True)
class ConvSpec:
    """What the registry knows about one conv type (all of it read off the block class).

    Attributes:
        name (str): The registered name (``RevGNN(conv=name)``).
        block (type): The block class.
        options (tuple of str): Its keyword options beyond ``channels``,
            ``norm``, ``preact`` and ``edge_channels``, from ``__init__``.
        defaults (dict): The default of each option.
        uses_edges (bool): ``__init__`` takes ``edge_channels``.
        factored_edges (bool): The block takes the model's edge embedding in
            factored form (:class:`~revgnn.nn.LinearEdgeFeatures`) rather than
            evaluated once for all layers.
        sar (type or str, optional): The SAR form of the PyG conv the block holds
            (a class, or ``"module:Class"`` where importing it here would be
            circular); :obj:`None`: the conv does not run under SAR.
    """

    name: str
    block: Type[nn.Module]
    options: Tuple[str, ...]
    defaults: Dict[str, Any]
    uses_edges: bool
    factored_edges: bool
    sar: Union[type, str, None] = None

    def sar_form(self) -> Optional[type]:
        """The SAR form's class (:attr:`sar` imported if named by a string), or :obj:`None`."""
        if not isinstance(self.sar, str):
            return self.sar
        module, _, qualname = self.sar.partition(":")
        obj = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        return obj

    @property
    def compact_mask(self) -> bool:
        """The block's ``forward`` takes ``dropout_scale``, so models hand it the shared dropout
        mask as bool (:class:`~revgnn.nn.SharedDropout` with ``compact=True``), a quarter of the
        float mask's bytes."""
        return "dropout_scale" in inspect.signature(self.block.forward).parameters

    @property
    def parameters(self) -> Tuple[str, ...]:
        """Every keyword the constructor accepts (after ``channels``)."""
        return (*STRUCTURAL[1:], *(("edge_channels",) if self.uses_edges else ()), *self.options)

    def check_options(self, options: Dict[str, Any], prefix: str = "") -> None:
        """Raises if ``options`` holds a keyword the block does not have (:class:`ValueError`) or
        a value its annotation does not allow: a type, a choice or a range, e.g. ``heads:
        Annotated[int, Range(1)]`` (:func:`~revgnn.utils.signature.check_types`); ``prefix`` goes
        before the key a value's error names."""
        bad = [k for k in options if k not in self.parameters]
        if bad:
            raise ValueError(
                f"conv={self.name!r} has no option(s) {', '.join(bad)}; it accepts "
                f"{', '.join(self.options) or 'no options'} (besides {', '.join(self.parameters[:2])}"
                f"{', edge_channels' if self.uses_edges else ''}; see {self.block.__name__})"
            )
        check_types(keyword_parameters(self.block), options, prefix)


def _spec(name: str, cls: type, factored_edges: bool = False, sar: Union[type, str, None] = None) -> ConvSpec:
    """The registry's entry for ``cls``: its :class:`ConvSpec`, read off ``__init__`` (which must
    fit :func:`register_conv`'s contract)."""
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise TypeError(f"register_conv({name!r}) decorates a torch.nn.Module class, got {cls!r}")
    if not (sar is None or isinstance(sar, type) or (isinstance(sar, str) and ":" in sar)):
        raise TypeError(f"register_conv({name!r}, sar=...) takes a class or 'module:Class', got {sar!r}")
    where = f"register_conv({name!r}): {cls.__name__}.__init__"
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]  # without self
    kinds = {p.kind for p in params}
    if inspect.Parameter.VAR_POSITIONAL in kinds or inspect.Parameter.VAR_KEYWORD in kinds:
        raise TypeError(f"{where} takes *args or **kwargs; name every option so it can be checked")
    names = [p.name for p in params]
    if not names or names[0] != "channels":
        raise TypeError(f"{where} must take `channels` as its first parameter, got ({', '.join(names)})")
    missing = [k for k in STRUCTURAL[1:] if k not in names]
    if missing:
        raise TypeError(
            f"{where} must accept {' and '.join(missing)} (models set them; subclass PreActBlock to get both)"
        )
    required = [p.name for p in params[1:] if p.default is inspect.Parameter.empty]
    if required:
        raise TypeError(f"{where} needs a default for {', '.join(required)}")
    options = [p for p in params if p.name not in (*STRUCTURAL, "edge_channels")]
    return ConvSpec(
        name=name,
        block=cls,
        options=tuple(p.name for p in options),
        defaults={p.name: p.default for p in options},
        uses_edges="edge_channels" in names,
        factored_edges=factored_edges,
        sar=sar,
    )


#: name -> :class:`ConvSpec` of every registered conv type. The built-in convs are registered by
#: :mod:`revgnn.nn.blocks`, which the package ``revgnn.nn`` imports before anything can read this.
CONVS: Registry = Registry("conv", _spec, how_to_add="add your own with register_conv")


def register_conv(
    name: str, *, factored_edges: bool = False, sar: Union[type, str, None] = None
) -> Callable[[type], type]:
    """Class decorator registering a conv block under ``name``.

    The class's ``__init__`` must take ``channels`` first, then ``norm`` and
    ``preact`` (which models set), optionally ``edge_channels`` (if it uses
    edge features) and any options of its own, all with defaults and by name
    (no ``*args``/``**kwargs``: the options are read from the signature).
    Its ``forward`` is ``forward(x, edge_index, edge_attr=None,
    dropout_mask=None)``, as :class:`~revgnn.nn.PreActBlock`'s.

    Args:
        name (str): The name models and configs use (``conv=name``).
        factored_edges (bool, optional): The block accepts edge features as a
            :class:`~revgnn.nn.LinearEdgeFeatures` and benefits from keeping
            them factored. (default: :obj:`False`)
        sar (type or str, optional): The conv's SAR form: a subclass of the PyG
            conv the block holds, adding no parameters, whose ``forward`` also
            takes a :class:`~revgnn.distributed.sar.SARGraph` (aggregating it
            shard by shard, e.g. with
            :func:`~revgnn.distributed.aggregate_sar.sar_aggregate`); a
            ``"module:Class"`` string names it without importing it now.
            :obj:`None`: the conv does not run under SAR, and
            :func:`~revgnn.distributed.convs.convert_to_sar` says so.
            (default: :obj:`None`)
    """
    return CONVS.register(name, factored_edges=factored_edges, sar=sar)


def conv_spec(name: str) -> ConvSpec:
    """The :class:`ConvSpec` of the conv registered as ``name``
    (:class:`~revgnn.utils.registry.UnknownName`, a ``ValueError``, naming the closest if none)."""
    return CONVS.get(name)


def list_convs() -> List[str]:
    """The names of the registered conv types, sorted."""
    return CONVS.names()


def make_block(conv: str, channels: int, **kwargs: Any) -> nn.Module:
    """Builds the block of the conv registered as ``conv`` with ``channels`` in and out.

    ``kwargs`` must be parameters of its constructor (:attr:`ConvSpec.parameters`).

    Example:
        >>> make_block("sage", 16, aggr="max").conv
        SAGEConv(16, 16, aggr=max)
    """
    spec = conv_spec(conv)
    spec.check_options(kwargs)
    return spec.block(channels, **kwargs)


def conv_name(block: nn.Module) -> str:
    """The registered name of ``block``'s class, or ``''`` if it is not a registered conv."""
    for spec in CONVS.values():
        if type(block) is spec.block:
            return spec.name
    return ""


def _choices(annotation) -> str:
    """The choices of a ``Literal`` annotation (inside ``Optional``/``Annotated``), as ``" (a, b)"``."""
    import typing

    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Literal:
        return " (" + ", ".join(map(str, args)) + ")"
    return next((c for c in map(_choices, args) if c), "")


def conv_table() -> str:
    """The markdown table of the registered conv blocks of this package (the README's, under the zoo
    table): the name models take (``conv=``), the conv, each option with its default and choices
    (read off the block's signature), whether it reads edge features and whether it runs under SAR
    (its registration names a SAR form)."""
    from revgnn.utils.signature import keyword_parameters

    lines = [
        "| `conv=` | block | options (default, choices) | edge features | SAR |",
        "|---|---|---|---|---|",
    ]
    norms = set()
    for spec in CONVS.values():
        if not spec.block.__module__.startswith("revgnn."):
            continue  # registered by a user or a test
        params = keyword_parameters(spec.block)
        norms.add(_choices(params["norm"].annotation))
        options = ", ".join(f"`{k}={v!r}`{_choices(params[k].annotation)}" for k, v in spec.defaults.items())
        what = " ".join((spec.block.__doc__ or "").split()).split(" in a pre-activation block")[0]
        lines.append(
            f"| `{spec.name}` | {spec.block.__name__}: {what} | {options or '—'} | "
            f"{'yes' if spec.uses_edges else 'no'} | {'yes' if spec.sar is not None else 'no'} |"
        )
    norm = " or ".join(sorted(norms)).strip()
    return "\n".join(lines) + f"\n\nEvery block also takes `norm`, the pre-activation norm {norm}.\n"
