"""The model registry: one entry per model variant, holding everything known about it.

A variant is a function that returns its model's arguments, decorated with :func:`register_model`,
which records the model class, the data set whose shapes the arguments hold, the exact parameter
count at those shapes and the scores a paper reports for it (:class:`Reported`):

.. code-block:: python

    @register_model(RevGNN, dataset="ogbn-proteins", num_parameters=20_031_384, paper=LI_2021,
                    reported=[Reported("RevGNN-Deep", "test ROC-AUC", 87.74, 0.13, ...)])
    def revgnn_deep() -> Dict[str, Any]:
        \"\"\"RevGNN-Deep: 1001 layers x 80 channels ...\"\"\"
        return dict(PROTEINS, num_layers=1001, hidden_channels=80, ...)

The decorator returns the factory ``revgnn_deep(**overrides) -> RevGNN``; ``create_model(name,
**overrides)`` calls it by name (:data:`MODELS`, a :class:`~revgnn.utils.registry.Registry`). Every
override must be an argument of the model class (or an option it forwards) and lie in the range its
annotation declares (``num_layers: Annotated[int, Range(1)]``, read by
:func:`revgnn.utils.signature.check_types`), so a typo is an error that lists what exists, never
silently ignored. The README's zoo table, the paper
column of ``revgnn-reproduce`` and the model configs all come from this registry: every variant is the
Hydra option ``model=<name>``, which the config layer stores in Hydra's ConfigStore from it
(:func:`revgnn.config.store.store_model_config`; a node holding the name only: the library itself imports no
Hydra), and
``python -m revgnn.models --markdown`` prints the table, ``--update-readme README.md`` writes it.

A variant registered by a user's module is chosen with ``model=<name>`` when the module is imported
before :func:`revgnn.config.store.register_configs` (which stores every registered variant), and with
``imports=[my_pkg.my_models] model.name=<name>`` on any ``revgnn-train`` command line
(:func:`revgnn.config.store.import_modules`).
"""

from __future__ import annotations

import difflib
import inspect
import re
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Type

from torch import nn

from revgnn.errors import ConfigError, ConfigTypeError
from revgnn.nn.conv_registry import conv_table
from revgnn.utils.registry import Registry
from revgnn.utils.signature import check_types, keyword_parameters, takes_options

__all__ = [
    "MODELS",
    "ModelInfo",
    "Reported",
    "register_model",
    "create_model",
    "list_models",
    "model_info",
    "model_arguments",
    "check_model_config",
    "paper_result",
    "zoo_table",
    "update_readme",
]

#: The target of every model config (``model=<name>``, :class:`revgnn.config.schema.ModelConfig`).
CONFIG_TARGET = "revgnn.models.create_model"

#: Arguments of every model that come from the data set (``revgnn.engine.tasks.shapes``).
SHAPE_ARGUMENTS = ("in_channels", "out_channels", "edge_channels", "species_channels")


@dataclass(frozen=True)
class Reported:
    """A score published for a registered variant, with the arguments it was obtained at.

    Args:
        label (str): The model's name in the source, e.g. ``"RevGNN-Deep"``.
        metric (str): What was measured, e.g. ``"test ROC-AUC"`` (values in percent).
        value (float): The reported mean.
        std (float, optional): The reported standard deviation; :obj:`None` where the source gives
            none. (default: :obj:`None`)
        source (str): Where the number is published: the paper and which of its results, or the
            example that reports it.
        overrides (Mapping, optional): Arguments that differ from the variant's defaults, e.g.
            ``{"hidden_channels": 224}``. (default: none)
        num_parameters (int, optional): Exact parameter count of ``create_model(name, **overrides)``
            at the data set's shapes; required with ``overrides``, the variant's own count without.
        paper_parameters (str, optional): The count the source states, e.g. ``"2.37M"``.
        experiment (str, optional): The experiment config (``revgnn/configs/experiment``) that
            trains exactly this model; :obj:`None` where there is none.
        note (str, optional): What the source did that this zoo does not. (default: :obj:`""`)
    """

    label: str
    metric: str
    value: float
    std: Optional[float] = None
    source: str = ""
    overrides: Mapping[str, Any] = field(default_factory=dict)
    num_parameters: Optional[int] = None
    paper_parameters: Optional[str] = None
    experiment: Optional[str] = None
    note: str = ""

    def score(self) -> str:
        """``"87.74 ± 0.13"``, or the mean alone when the source gives no deviation."""
        return f"{self.value:.2f}" + ("" if self.std is None else f" ± {self.std:.2f}")


@dataclass(frozen=True)
class ModelInfo:
    """Everything the registry knows about one variant (:func:`model_info`): its ``name``, model
    class ``cls``, the arguments ``defaults`` it builds ``cls`` with, a one-line ``summary`` (its
    docstring's first paragraph), the ``dataset`` whose shapes ``defaults`` hold, the exact
    ``num_parameters`` at those shapes, the ``paper`` it comes from and its ``reported`` scores."""

    name: str
    cls: Type[nn.Module]
    defaults: Mapping[str, Any]
    summary: str
    dataset: Optional[str]
    num_parameters: Optional[int]
    paper: Optional[str]
    reported: Tuple[Reported, ...]

    def parameters_of(self, result: Reported) -> Optional[int]:
        """The exact parameter count of the model ``result`` was obtained with."""
        return self.num_parameters if result.num_parameters is None else result.num_parameters


#: name -> factory of every registered variant (its :class:`ModelInfo` is the factory's ``info``).
MODELS: Registry = Registry(
    "model", how_to_add="add your own with register_model, its module named in imports"
)


def register_model(
    cls: Type[nn.Module],
    *,
    dataset: Optional[str] = None,
    num_parameters: Optional[int] = None,
    paper: Optional[str] = None,
    reported: Sequence[Reported] = (),
    name: Optional[str] = None,
) -> Callable[[Callable[[], Dict[str, Any]]], Callable[..., nn.Module]]:
    """Registers the variant whose arguments the decorated function returns.

    Args:
        cls (type): The model class the variant builds.
        dataset (str, optional): The data set whose shapes the arguments hold (``in_channels``,
            ...). Every variant of this package names one. (default: :obj:`None`)
        num_parameters (int, optional): Exact parameter count of the variant at those shapes; every
            variant of this package gives it, and a test builds each and checks it.
            (default: :obj:`None`)
        paper (str, optional): The paper the variant comes from. (default: :obj:`None`)
        reported (sequence of Reported, optional): Published scores. (default: none)
        name (str, optional): Registered name. (default: the function's name)

    Returns:
        The factory ``fn(**overrides) -> cls``, named and documented as the decorated function.
    """

    def wrap(arguments: Callable[[], Dict[str, Any]]) -> Callable[..., nn.Module]:
        key = name or arguments.__name__
        if key in MODELS:
            raise ValueError(f"a model named {key!r} is already registered ({MODELS[key].__module__})")
        defaults = types.MappingProxyType(dict(arguments()))
        _check_arguments(cls, defaults, owner=f"the defaults of {key!r}: ")
        for result in reported:
            _check_arguments(cls, result.overrides, owner=f"{key!r}, reported {result.label!r}: ")
            if result.overrides and result.num_parameters is None:
                raise ValueError(
                    f"{key!r}: reported {result.label!r} has overrides {dict(result.overrides)}; "
                    "give its num_parameters"
                )
        summary = inspect.cleandoc(arguments.__doc__ or "").split("\n\n")[0].replace("\n", " ")
        info = ModelInfo(key, cls, defaults, summary, dataset, num_parameters, paper, tuple(reported))

        def factory(**overrides: Any) -> nn.Module:
            _check_arguments(cls, overrides, owner=f"{key!r}: ", defaults=defaults)
            return cls(**{**own_conv_options(cls, defaults, overrides), **overrides})

        factory.__name__ = factory.__qualname__ = key
        factory.__module__ = arguments.__module__
        factory.__doc__ = arguments.__doc__
        factory.info = info
        MODELS.register(key, factory)
        return factory

    return wrap


def list_models(pattern: str = "*") -> List[str]:
    """Registered model names matching the shell-style ``pattern``, sorted."""
    return MODELS.names(pattern)


def model_info(name: str) -> ModelInfo:
    """The registry's entry for ``name``: class, defaults, data set, parameter count, scores."""
    return MODELS.get(name).info


def create_model(name: str, **overrides: Any) -> nn.Module:
    """Builds the registered model ``name`` with keyword ``overrides``.

    Raises:
        ValueError: ``name`` is not registered (the message lists the names), or an override lies
            outside its range.
        TypeError: an override is not an argument of the model (the message lists the arguments).
    """
    return MODELS.get(name)(**overrides)


def model_arguments(model: Any) -> List[str]:
    """The keyword arguments of a model class or of the registered variant ``model``: the class's
    own, then the options its ``**options`` forward (:func:`forwarded_options`; for a variant those
    of its own conv, for a class those of its default conv)."""
    info = model_info(model) if isinstance(model, str) else None
    cls = model if info is None else info.cls
    forwarded, _ = forwarded_options(cls, {} if info is None else info.defaults)
    return [*keyword_parameters(cls), *(forwarded or {})]


def forwarded_options(
    cls: Type[nn.Module], arguments: Mapping[str, Any], prefix: str = ""
) -> Tuple[Optional[Dict[str, inspect.Parameter]], str]:
    """The parameters a model class's ``**options`` take for the constructor ``arguments`` and whose
    they are (a conv's block, the DEQ), from the class's ``forwarded_options`` classmethod; none
    for a class without ``**options``, :obj:`None` (anything goes, unchecked) for a class that takes
    ``**options`` without saying where they go."""
    if not takes_options(cls):
        return {}, ""
    if not hasattr(cls, "forwarded_options"):
        return None, ""
    return cls.forwarded_options(arguments, prefix)


def own_conv_options(
    cls: Type[nn.Module], defaults: Mapping[str, Any], overrides: Mapping[str, Any]
) -> Mapping[str, Any]:
    """A variant's ``defaults`` as they apply under ``overrides``: when the overrides switch ``conv`` to
    another conv, the options the variant set for its own conv (GEN's ``aggr='max'``, ...) are dropped,
    so the other conv starts from its own defaults rather than being refused (``conv='gat'``: GAT has no
    ``aggr``) or silently given them (``conv='sage'`` with GEN's max in place of SAGE's mean). The
    model's own arguments are kept."""
    if "conv" not in overrides or overrides["conv"] == defaults.get("conv"):
        return defaults
    options, _ = forwarded_options(cls, defaults)
    if not options:
        return defaults
    params = keyword_parameters(cls)
    return {k: v for k, v in defaults.items() if k in params or k not in options}


def _check_arguments(
    cls: Type[nn.Module],
    arguments: Mapping[str, Any],
    prefix: str = "",
    owner: str = "",
    defaults: Mapping[str, Any] = types.MappingProxyType({}),
) -> None:
    """Every key of ``arguments`` is an argument of ``cls`` or an option its ``**options`` forward
    (:func:`forwarded_options`, for ``defaults`` updated by ``arguments``), of the type its
    annotation says, and in its range; ``prefix`` goes before every key an error names
    (``"model."``), ``owner`` says whose arguments they are (in a message about a value only where
    no ``prefix`` says it)."""
    params = keyword_parameters(cls)
    defaults = own_conv_options(cls, defaults, arguments)
    forwarded, whose = forwarded_options(cls, {**defaults, **arguments}, prefix)
    if forwarded is None:  # the class takes any keyword and checks none: neither can this
        forwarded = {k: inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY) for k in arguments}
    unknown = sorted(k for k in arguments if k not in params and k not in forwarded)
    if unknown:
        close = difflib.get_close_matches(unknown[0], [*params, *forwarded], n=1)
        hint = f" (did you mean {prefix}{close[0]}?)" if close else ""
        also = f", and the options of {whose}: {', '.join(forwarded)}" if forwarded else ""
        also = also or (f"; {whose} takes no options" if whose else "")
        raise ConfigTypeError(
            f"{owner}{cls.__name__} has no argument(s) {', '.join(repr(prefix + k) for k in unknown)}"
            f"{hint}; valid overrides: {', '.join(params)}{also}"
        )
    try:
        check_types({**forwarded, **params}, arguments, prefix)
    except (TypeError, ValueError) as e:
        if prefix:  # the key names the config node already
            raise
        raise type(e)(f"{owner}{e}") from None


def check_model_config(model_cfg: Mapping[str, Any], prefix: str = "model.") -> None:
    """Checks a model config (``model=<name>`` plus overrides) against the signature of its model
    class before anything is built: the name is registered, every other key is an argument of the
    class or an option it forwards (a conv's, the DEQ's), of the annotated type and choices, and in
    its range (the annotations), and what spans several keys holds (the class's ``check_options``
    classmethod, e.g. ``hidden_channels`` divisible by ``num_groups``, a DEQ's solver options).
    Raises :class:`~revgnn.errors.ConfigError` (one message naming the key, no traceback from
    ``revgnn-train``). A config with another ``_target_`` (a user's own factory) is left to that
    factory."""
    if model_cfg.get("_target_") != CONFIG_TARGET:
        return
    if "name" not in model_cfg:
        raise ConfigError(f"{prefix}name is missing: choose one of {', '.join(list_models())}")
    name = model_cfg["name"]
    if name not in MODELS:
        raise ConfigError(str(MODELS.unknown(name, prefix=f"{prefix}name: ")))
    overrides = {k: v for k, v in model_cfg.items() if k not in ("_target_", "name")}
    info = model_info(name)
    try:
        _check_arguments(info.cls, overrides, prefix, owner=f"{name!r}: ", defaults=info.defaults)
        if hasattr(info.cls, "check_options"):
            info.cls.check_options({**info.defaults, **overrides}, prefix)
    except (TypeError, ValueError) as e:
        raise ConfigError(str(e)) from None


def paper_result(experiment: str) -> Optional[Tuple[ModelInfo, Reported]]:
    """The variant and the published score that ``experiment`` reproduces, or :obj:`None`."""
    found = [(f.info, r) for f in MODELS.values() for r in f.info.reported if r.experiment == experiment]
    if len(found) > 1:
        raise ValueError(
            f"experiment {experiment!r} is named by several reported scores: "
            + ", ".join(f"{i.name} {r.label}" for i, r in found)
        )
    return found[0] if found else None


def _size(info: ModelInfo) -> str:
    d = info.defaults
    depth = d.get("num_layers", "equilibrium" if "max_iter" in model_arguments(info.name) else "")
    return f"{depth} × {d.get('hidden_channels', '')}"


def _markdown(text: str) -> str:
    """A docstring sentence as markdown: ``x`` and :func:`x` become `x`."""
    return re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text.replace("``", "`")).rstrip(".")


def _reported_cell(info: ModelInfo) -> str:
    if not info.reported:
        return "—"
    by_metric: Dict[str, List[str]] = {}
    for r in info.reported:
        extras = [f"`{k}={v}`" for k, v in r.overrides.items()]
        if r.overrides:
            extras.append(f"{info.parameters_of(r):,} params")
        if r.paper_parameters:
            extras.append(f"source: {r.paper_parameters} params")
        entry = f"**{r.score()}** {r.label}" + (f" ({', '.join(extras)})" if extras else "")
        by_metric.setdefault(r.metric, []).append(entry)
    lines = [f"{metric}: {' · '.join(entries)}" for metric, entries in by_metric.items()]
    lines += list(dict.fromkeys(r.source for r in info.reported))
    lines += [f"*{r.label}: {r.note}*" for r in info.reported if r.note]
    return "<br>".join(lines)


def zoo_table(pattern: str = "*") -> str:
    """The markdown tables of the zoo (the README's, between its zoo markers): one row per variant of
    this package, its published scores with the arguments they were obtained at; then the conv blocks
    (:func:`revgnn.nn.conv_registry.conv_table`)."""
    lines = [
        "| name | model | layers × channels | parameters (data set) | reported | experiment |",
        "|---|---|---|---|---|---|",
    ]
    for name in list_models(pattern):
        info = model_info(name)
        if not info.cls.__module__.startswith("revgnn."):
            continue  # registered by a user or a test
        experiments = ", ".join(f"`{r.experiment}`" for r in info.reported if r.experiment) or "—"
        lines.append(
            f"| `{name}` | {_markdown(info.summary)} | {_size(info)} | {info.num_parameters:,} "
            f"({info.dataset}) | {_reported_cell(info)} | {experiments} |"
        )
    intro = "\n\nThe conv blocks every model takes (`conv=`; options as `model.<option>=`):\n\n"
    return "\n".join(lines) + intro + conv_table()


BEGIN, END = "<!-- zoo:begin -->", "<!-- zoo:end -->"


def readme_zoo(text: str) -> str:
    """The text between the zoo markers of a README."""
    match = re.search(re.escape(BEGIN) + r"\n(.*?)" + re.escape(END), text, flags=re.S)
    if match is None:
        raise ValueError(f"no {BEGIN} ... {END} block in the README")
    return match.group(1)


def update_readme(path: str) -> bool:
    """Writes :func:`zoo_table` between the README's zoo markers; returns whether it changed."""
    with open(path) as f:
        text = f.read()
    old = readme_zoo(text)
    new = zoo_table()
    if old == new:
        return False
    start = text.index(BEGIN) + len(BEGIN) + 1
    with open(path, "w") as f:
        f.write(text[:start] + new + text[start + len(old) :])
    return True
