"""Structured schemas for the Hydra configuration (``revgnn/configs``).

Every YAML file is merged onto one of these dataclasses, so a misspelt key or a value of the wrong type
fails at composition time with an error that names the key, instead of being silently ignored.

* ``TrainConfig`` types the primary config (``train.yaml``) and its fixed groups ``trainer``, ``logger``
  and ``backend``; a key added with Hydra's ``+key=value``, which composition lets through, is refused
  when the run starts (:func:`check_keys`).
* A ``data`` option's schema is derived from the signature of the loader its ``_target_`` names
  (:func:`data_schema`): one typed field per parameter, with the parameter's default and the
  :class:`~revgnn.utils.ranges.Range` its annotation declares. It is stored under the loader's function
  name, and the option selects it in its own ``defaults`` list, e.g. ``data/proteins_like.yaml`` starts
  with ``defaults: [/schema/data@_here_: proteins_like, _self_]``. A new data set is therefore its loader
  plus one YAML file; every ``_target_`` in ``revgnn/configs/data`` gets its schema at import.
* The ``optim`` group has one schema per option.
* A ``model`` option (``model=<name>``) is the name of a registered variant, and every variant is one:
  the options are stored in Hydra's ConfigStore (:func:`store_model_config`), not written as files,
  for the variants of this package when this module is imported (their names read from the
  ``@register_model`` decorators in ``revgnn/models/*.py``, :func:`builtin_model_names`, so that torch
  is not imported) and for any other when it registers. :class:`ModelConfig` types only ``_target_``
  and ``name`` and leaves the node open, so every argument of the variant's model class can be set
  (``model.learn_t=true``). The keys are checked against that class's signature by
  :func:`revgnn.models.check_model_config` when a run starts, before any data is loaded: a key that is
  no argument is an error naming it and listing those that are.

This module imports neither torch nor PyG (nor do the loader modules it reads signatures from), so
``revgnn-train --help`` and ``--cfg job`` stay fast.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import sys
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Dict, List, Literal, Optional, get_args, get_origin

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from revgnn.errors import ConfigError, ConfigTypeError
from revgnn.utils.ranges import Range

__all__ = [
    "TrainConfig",
    "TrainerConfig",
    "LoggerConfig",
    "BackendConfig",
    "ModelConfig",
    "store_model_config",
    "builtin_model_names",
    "data_schema",
    "data_schemas",
    "AdamConfig",
    "Device",
    "Precision",
    "PartitionMode",
    "register_configs",
    "check_ranges",
    "check_keys",
    "ConfigError",
    "ConfigTypeError",
    "refuse",
    "have_submitit",
    "check_launcher",
    "import_modules",
    "hydra_quote",
    "hydra_override",
    "PATH_KEYS",
    "quote_path_overrides",
    "register_data_dir",
]


def import_modules(names: Any, key: str = "imports") -> None:
    """Imports the modules ``names`` (the config's ``imports``, e.g. ``[my_pkg.my_models]``), so that
    what they register (:func:`~revgnn.models.register_model`, :func:`~revgnn.nn.register_conv`,
    :func:`~revgnn.deq.register_solver`, :func:`~revgnn.engine.backends.register_backend`) can be
    named by the config (``model.name=my_model``, ``model.conv=my_conv``, ...). A module is looked up
    on ``sys.path`` and then in the working directory (as ``python -m`` does); one that is not found
    is a :class:`ConfigError` naming it (an error inside the module is its own traceback)."""
    import os

    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    for i, name in enumerate(names or ()):
        try:
            importlib.import_module(str(name))
        except ModuleNotFoundError as e:
            if e.name is None or not (name == e.name or str(name).startswith(e.name + ".")):
                raise  # the module was found and failed importing something else
            raise ConfigError(
                f"{key}[{i}]={name}: no module named {e.name!r} on the Python path or in the working "
                f"directory {os.getcwd()}; add its directory to PYTHONPATH"
            ) from None
    registry = sys.modules.get("revgnn.models.registry")
    for model in registry.list_models() if registry is not None else ():
        store_model_config(model)  # model=<name> for what they registered (the library stores none)


def ranged(
    default: Any,
    low: Optional[float] = None,
    high: Optional[float] = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
) -> Any:
    """A schema field whose value must lie in ``[low, high]`` (``(`` / ``)`` where open); ``None``
    stays allowed for ``Optional`` fields. :func:`check_ranges` enforces it."""
    return field(default=default, metadata={"range": Range(low, high, low_open, high_open)})


def check_keys(cfg: DictConfig, schema: Optional[type] = None, path: str = "") -> None:
    """Raises :class:`ConfigError` naming a key that ``schema`` (default: :class:`TrainConfig`) and
    its typed sections (``trainer``, ``logger``, ``backend``) do not have. Composition refuses a
    misspelt key, but Hydra's ``+key=value`` adds one even to a structured config, and the loop would
    ignore it. The open sections (``model``, ``data``, ``optim``) pass every key to what they build,
    which checks it (:func:`revgnn.models.check_model_config`, the loader's and the optimiser's
    signature)."""
    import difflib
    from typing import get_type_hints

    schema = TrainConfig if schema is None else schema
    hints = get_type_hints(schema)
    names = [f.name for f in dataclasses.fields(schema)]
    for key in cfg:
        if key not in hints:
            close = difflib.get_close_matches(str(key), names, 1)
            raise ConfigError(
                f"unknown key {path}{key}: revgnn-train has no such setting"
                + (f" (did you mean {path}{close[0]}?)" if close else "")
                + f"; {path.rstrip('.') or 'the top level'} takes {', '.join(names)}"
            )
        if dataclasses.is_dataclass(hints[key]) and isinstance(cfg.get(key), DictConfig):
            check_keys(cfg[key], hints[key], f"{path}{key}.")


def check_ranges(cfg: DictConfig, path: str = "") -> None:
    """Raises :class:`ConfigError` naming the key for every value outside the range its schema
    declares (:func:`ranged`); walks the whole config, whatever schema each node has."""
    schema = OmegaConf.get_type(cfg)
    if dataclasses.is_dataclass(schema):
        for f in dataclasses.fields(schema):
            bounds = f.metadata.get("range")
            value = cfg.get(f.name) if bounds else None
            if value is None or OmegaConf.is_missing(cfg, f.name):
                continue
            if not bounds.contains(value):
                raise ConfigError(f"{path}{f.name} must be {bounds.describe()}, got {value}")
    for key in cfg:
        if (
            isinstance(key, str)
            and not OmegaConf.is_missing(cfg, key)
            and isinstance(cfg.get(key), DictConfig)
        ):
            check_ranges(cfg[key], f"{path}{key}.")


class Device(str, Enum):
    """Where to train: ``auto`` picks CUDA when available."""

    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


class Precision(str, Enum):
    """``auto``: bf16 autocast on CUDA, fp32 on CPU. ``bf16`` on CPU is allowed but slow. The ogbn-proteins
    paper experiments set ``fp32``, as the official code trains (docs/fidelity.md); bf16 is opt-in there."""

    auto = "auto"
    fp32 = "fp32"
    bf16 = "bf16"


class DistBackend(str, Enum):
    """The ``torch.distributed`` backend of ``ddp`` and ``sar`` (``null`` in the config: gloo on CPU,
    NCCL on CUDA)."""

    gloo = "gloo"
    nccl = "nccl"


class PartitionMode(str, Enum):
    """How a random node partition is drawn (:func:`revgnn.data.random_parts.random_partition`)."""

    balanced = "balanced"
    uniform = "uniform"


@dataclass
class ModelConfig:
    """A model option: the registered variant ``name``, built by :func:`revgnn.models.create_model`.

    Stored open (struct off, :func:`register_configs`): any other key is an override of one of the
    variant's arguments, checked against its model class by :func:`revgnn.models.check_model_config`.
    ``in_channels``, ``out_channels``, ``edge_channels`` and ``species_channels`` come from the data set.
    """

    _target_: str = "revgnn.models.create_model"
    name: str = MISSING


def store_model_config(name: str) -> None:
    """Stores the Hydra option ``model=<name>`` for the registered variant ``name``: the open model
    schema (:class:`ModelConfig`) with the name, which is all a model option holds (the variant's
    arguments are the registry's, :func:`revgnn.models.model_info`)."""
    node = {"defaults": [{"/schema/model@_here_": "model"}, "_self_"], "name": name}
    ConfigStore.instance().store(group="model", name=name, node=node)


def builtin_model_names(models_dir: Optional[Path] = None) -> List[str]:
    """The names the ``@register_model`` decorators in ``models_dir`` (default: ``revgnn/models``)
    register, read from the source so that the ``model`` options exist without importing torch (the
    decorator's ``name=`` when given, else the function's name); ``tests/models/test_zoo.py`` checks them
    against the registry."""
    names = []
    for path in sorted((models_dir or Path(__file__).parent / "models").glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            for dec in getattr(node, "decorator_list", ()):
                func = dec.func if isinstance(dec, ast.Call) else dec
                if getattr(func, "id", getattr(func, "attr", None)) != "register_model":
                    continue
                given = [k.value for k in getattr(dec, "keywords", ()) if k.arg == "name"]
                names.append(ast.literal_eval(given[0]) if given else node.name)
    return sorted(names)


_DATA_CONFIGS = Path(__file__).parent / "configs" / "data"
#: one schema class per loader function, so that every composition (and every pickled config sent to
#: a worker) refers to the same class object
_DATA_SCHEMAS: Dict[Any, type] = {}


def data_schema(target: str) -> type:
    """The structured schema of a ``data`` option whose ``_target_`` is ``target`` (a loader function's
    dotted path), derived from the loader's signature: one field per parameter, typed by its annotation,
    defaulting to its default (``???``, i.e. required, where it has none) and carrying the
    :class:`~revgnn.utils.ranges.Range` of an ``Annotated[T, Range(...)]`` annotation for
    :func:`check_ranges`; a ``Literal`` choice (``node_order: NodeOrder``) is a field of its values' type,
    its choices checked before anything loads (:func:`revgnn.engine.preflight.check_data_config` reads
    the signature). Misspelt keys and values of the wrong type then fail at composition, naming the
    key. The loader's module must import without torch (import it inside the function). The schema of a
    loader is built once and reused.
    """
    module, _, name = target.rpartition(".")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as e:
        raise ImportError(f"data loader {target!r} cannot be imported ({e}); fix the _target_") from e
    if fn in _DATA_SCHEMAS:
        return _DATA_SCHEMAS[fn]
    fields: list = [("_target_", str, field(default=target))]
    for p in inspect.signature(fn).parameters.values():
        if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            raise TypeError(
                f"{target}: parameter {p.name!r} is {p.kind.description}; a loader takes named ones"
            )
        if p.annotation is p.empty:
            raise TypeError(f"{target}: parameter {p.name!r} has no type annotation, which its config needs")
        hint = eval(p.annotation, fn.__globals__) if isinstance(p.annotation, str) else p.annotation
        metadata = {}
        if get_origin(hint) is Annotated:
            hint, *extras = get_args(hint)
            ranges = [r for r in extras if isinstance(r, Range)]
            metadata = {"range": ranges[0]} if ranges else {}
        if get_origin(hint) is Literal:  # a choice: the type of its values (OmegaConf holds no Literal)
            hint = type(get_args(hint)[0])
        default = MISSING if p.default is p.empty else p.default
        fields.append((p.name, hint, field(default=default, metadata=metadata)))
    schema = dataclasses.make_dataclass(f"{name}_config", fields)
    try:
        OmegaConf.structured(schema)
    except Exception as e:  # omegaconf.ValidationError: a type a config cannot hold
        raise TypeError(f"{target}: its signature cannot be a config schema ({e})") from e
    # importable by a name unique to the loader, so a composed config pickles (torch.multiprocessing
    # workers, run_workers): importing this module in a worker builds the package's schemas again
    schema.__module__ = __name__
    schema.__qualname__ = "_data_schema_" + target.replace(".", "_")
    globals()[schema.__qualname__] = schema
    _DATA_SCHEMAS[fn] = schema
    return schema


def data_schemas(config_dir: Optional[Path] = None) -> Dict[str, type]:
    """``{loader function name: schema}`` for every ``_target_`` named in ``config_dir``'s YAML files
    (default: the package's ``data`` group); the name is what an option's ``defaults`` list selects."""
    schemas: Dict[str, type] = {}
    targets: Dict[str, str] = {}
    for path in sorted(Path(config_dir or _DATA_CONFIGS).glob("*.yaml")):
        target = OmegaConf.load(path).get("_target_")
        if not isinstance(target, str):
            raise ValueError(f"{path} names no _target_: a data option says which loader builds it")
        name = target.rpartition(".")[2]
        if targets.setdefault(name, target) != target:
            raise ValueError(f"two data loaders are named {name!r} ({targets[name]}, {target}): rename one")
        if name not in schemas:
            schemas[name] = data_schema(target)
    return schemas


@dataclass
class AdamConfig:
    """``torch.optim.Adam``, built partially and completed with the model's parameters."""

    _target_: str = "torch.optim.Adam"
    _partial_: bool = True
    lr: float = ranged(1e-3, 0, low_open=True)
    weight_decay: float = ranged(0.0, 0)


@dataclass
class TrainerConfig:
    """The training loop's schedule (``revgnn/engine/loop.py``).

    Attributes:
        epochs: Passes over the graph; each draws a new random partition.
        train_parts: Parts ``K`` of that partition (its induced sub-graphs).
        parts_per_step: Parts per optimiser step, their gradients accumulated (the loss is the mean over
            all their labelled nodes); ``null``: one per worker (1 locally). Under ``backend=ddp`` a
            step's parts are dealt out, ``parts_per_step / workers`` each, so 2 workers equal one
            process with ``parts_per_step=2``.
        partition: How each random partition (training, evaluation views) assigns nodes to parts:
            ``uniform`` draws every node's part on its own (the official code's ``randint``: part sizes
            vary, multinomially), ``balanced`` cuts a random permutation (sizes differ by at most one).
        shuffle_parts: Visit an epoch's parts in a random order (the official code) instead of
            ``0, 1, ..., K-1``; with ``parts_per_step > 1`` the shuffled parts are grouped in order.
        eval_every: Evaluate (and checkpoint "best") every this many epochs, and after the last one.
            This evaluation selects the model (best validation score).
        eval_views: Independent random partitions at inference ``V``; logits are averaged over views.
        eval_parts: Parts per inference view (1 = the full graph at once).
        fixed_eval_views: Draw the evaluation's views once, before the first epoch, and score every
            evaluation on them (the official code: 1 view x 5 parts drawn at start), instead of fresh
            views each time. The draw depends on ``seed`` alone, so a resumed run scores on the same views.
        test_views: Views of the final test: after the last epoch the loop loads ``best.pt`` and scores it
            on ``test_views`` fresh views of ``test_parts`` parts, logits averaged (the official
            ``test.py``: 10 x 3), reported as ``checkpoint_test`` in ``summary.json`` and as the last
            ``metrics.csv`` row; ``null`` runs no final test.
        test_parts: Parts per view of the final test.
        grad_clip: Max global gradient norm; 0 disables clipping.
        flat_params: Keep all parameters in one buffer and their gradients in another
            (:class:`revgnn.utils.flat.FlatParameters`), so the optimiser updates a few 4 MiB chunks
            rather than ~10 tensors per layer: the same update for element-wise optimisers (Adam,
            SGD, ...; others are refused), with a parameter that got no gradient treated as a zero
            gradient. On CPU that makes Adam's step at 1001 layers many times faster
            (``benchmarks/optimizer.py``; figures in ``docs/bench/in_code.md``).
        compile: Compile the model's forward with :func:`torch.compile` (``nn.Module.compile``: the
            parameters, checkpoints and state dict stay the module's own) for training and evaluation,
            under ``backend=local`` and ``ddp``; ``backend=sar`` refuses it (its ring communication
            runs inside autograd functions that ``torch.compile`` does not trace). What compiles
            without graph breaks: ``docs/guides/blocks.md``.

    ``train_parts``, ``partition``, ``shuffle_parts`` and the views and parts concern node-level data (one
    big graph); graph-level data sets (``data=mol_like``, ``data=ogbg_molhiv``) are batched by their own
    ``data.batch_size`` and evaluated on whole graphs, as ``backend=sar`` is on the full graph: there
    the evaluation has no random view to fix, and the final test scores ``best.pt`` that way.
    """

    epochs: int = ranged(100, 1)
    train_parts: int = ranged(10, 1)
    parts_per_step: Optional[int] = ranged(None, 1)
    partition: PartitionMode = PartitionMode.balanced
    shuffle_parts: bool = False
    eval_every: int = ranged(1, 1)
    eval_views: int = ranged(1, 1)
    eval_parts: int = ranged(5, 1)
    fixed_eval_views: bool = False
    test_views: Optional[int] = ranged(None, 1)
    test_parts: int = ranged(3, 1)
    grad_clip: float = ranged(1.0, 0)
    flat_params: bool = True
    compile: bool = False


@dataclass
class LoggerConfig:
    """Outputs besides the always-written ``metrics.csv`` and ``summary.json``."""

    tensorboard: bool = False
    plot: bool = True
    progress_bar: bool = True


@dataclass
class BackendConfig:
    """Execution backend (:mod:`revgnn.engine.backends`), by ``name``: ``local`` (one process), ``ddp``
    (data-parallel over the parts of each epoch's partition, one process per worker started by
    ``torchrun``), ``sar`` (distributed full-graph training, one process per worker started by
    ``torchrun``, on a graph partitioned by ``revgnn-partition``) or a backend that a module named in
    ``imports`` registers (checked against the registry when the run starts); device, numeric
    precision, CPU threads (``null``: the CPU affinity mask and cgroup quota, revgnn.utils.threads);
    for ``ddp`` and ``sar`` the peer timeout (every wait is bounded by it) and the torch.distributed
    backend (``null``: gloo on CPU, NCCL on CUDA); for ``sar`` the partition directory."""

    name: str = "local"
    device: Device = Device.auto
    precision: Precision = Precision.auto
    num_threads: Optional[int] = ranged(None, 1)
    partition_dir: Optional[str] = None
    timeout_s: float = ranged(300.0, 0, low_open=True)
    dist_backend: Optional[DistBackend] = None


@dataclass
class TrainConfig:
    """The whole job. ``model``, ``data`` and ``optim`` are typed by their options' own schemas.
    ``overwrite``: let a run replace the files of an earlier one in its output directory, which is
    refused otherwise, unless the run resumes from a checkpoint there
    (:func:`revgnn.engine.checkpoint.check_run_dir`). ``imports``: modules imported before anything
    is built (:func:`import_modules`), so that a model, conv, DEQ solver or backend they register can
    be named in the config."""

    model: Any = MISSING
    data: Any = MISSING
    optim: Any = MISSING
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)
    name: str = "default"
    seed: int = 0
    ckpt_path: Optional[str] = None
    resume_allow: List[str] = field(default_factory=list)
    output_dir: Optional[str] = None
    overwrite: bool = False
    imports: List[str] = field(default_factory=list)


def _run_dir(output_dir: Optional[str], default: str) -> str:
    """``hydra.run.dir`` / ``hydra.sweep.dir``: ``output_dir`` when set, so a run keeps all its files
    (checkpoints, ``.hydra/``, ``train.log``) in one directory."""
    return default if output_dir in (None, "") else str(output_dir)


def _stamp(default: str) -> str:
    """The run directory's time stamp: rank 0's start time under ``torchrun`` (shared as
    ``REVGNN_RUN_STAMP`` by :mod:`revgnn.distributed.torchrun`), else ``default`` (Hydra's ``now``)."""
    import os

    return os.environ.get("REVGNN_RUN_STAMP") or default


#: The keys the command line of a multirun sweeps, as JSON, set by :class:`CheckBeforeStart` in
#: the process that launches the sweep: a job that a launcher runs in another process (submitit's,
#: locally or on SLURM, which pass the environment on) has another command line.
SWEPT_KEYS_ENV = "REVGNN_SWEPT_KEYS"


def _swept_keys(overrides: List[str]) -> List[str]:
    """Keys that ``overrides`` sweep (``k=a,b``, ``k=range(...)``, ``choice``, ``glob``,
    ``interval``), as Hydra's override parser reads them; ``[]`` when they do not parse."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    given = [o for o in overrides if "=" in o and not o.startswith("-")]
    try:
        parsed = OverridesParser.create().parse_overrides(given)
    except Exception:  # Hydra reports a bad override itself
        return []
    return [o.key_or_group for o in parsed if o.is_sweep_override()]


def _job_swept_keys() -> List[str]:
    """The keys this job's sweep sweeps: from :data:`SWEPT_KEYS_ENV`, else this process's command
    line (a sweep started without the callback)."""
    import json
    import os
    import sys

    if SWEPT_KEYS_ENV in os.environ:
        return list(json.loads(os.environ[SWEPT_KEYS_ENV]))
    return _swept_keys(sys.argv[1:])


def _job_dir(num: Any, overrides: Any) -> str:
    """``hydra.sweep.subdir``: the job number and the values of the swept keys
    (``1_optim.lr=0.01``; all of the job's overrides when no sweep syntax is on the command line, e.g.
    a sweeper plugin), path separators replaced, so every job of a sweep over any key gets its own,
    readable directory (the job's full overrides are in its ``.hydra/overrides.yaml``)."""
    items = [str(o) for o in overrides]
    swept = _job_swept_keys()
    chosen = [o for o in items if o.split("=", 1)[0].lstrip("+~") in swept] or items
    name = "_".join([str(num)] + ([",".join(chosen)] if chosen else [])).replace("/", "_")
    if len(name) > 120:  # file systems cap names at 255 bytes; keep it readable and unique
        import hashlib

        name = f"{name[:100]}..{hashlib.sha1(name.encode()).hexdigest()[:10]}"
    return name


def refuse(error: ConfigError) -> None:
    """Ends ``revgnn-train`` with the message alone (logging is not set up yet; :func:`revgnn.cli.train.main`
    logs it the same way later) and status 2."""
    import sys

    print(f"revgnn-train: {error}", file=sys.stderr)
    sys.exit(2)


#: ``hydra/launcher`` options that are Hydra's submitit plugin (revgnn's, in
#: ``configs/hydra/launcher/``, and the plugin's own).
SUBMITIT_LAUNCHERS = ("slurm", "local", "submitit_slurm", "submitit_local")
#: How to get the plugin: the ``cluster`` extra (``pyproject.toml``).
CLUSTER_EXTRA = 'pip install "revgnn[cluster]" (in a checkout: pip install ".[cluster]")'


def have_submitit() -> bool:
    """Whether Hydra's submitit launcher plugin (the ``cluster`` extra) is installed."""
    import importlib.util

    try:
        return importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is not None
    except (ImportError, ValueError):  # no hydra_plugins namespace at all
        return False


def check_launcher(overrides: List[str]) -> None:
    """Raises :class:`ConfigError` saying how to install it when ``overrides`` select a submitit
    launcher (``hydra/launcher=slurm``, ...) and the plugin is missing, where Hydra would only say
    that it cannot load ``hydra/launcher/submitit_*``."""
    for arg in overrides:
        key, _, value = arg.partition("=")
        if key.lstrip("+~") == "hydra/launcher" and value in SUBMITIT_LAUNCHERS and not have_submitit():
            raise ConfigError(
                f"hydra/launcher={value} is Hydra's submitit launcher, which is not installed: it comes "
                f"with revgnn's cluster extra, {CLUSTER_EXTRA}"
            )


#: Keys whose values are paths: a value holding ``=``, ``,``, a space, quotes or brackets is quoted
#: for Hydra when given unquoted (:func:`quote_path_overrides`), as a sweep job's directory
#: (``1_seed=1``) is.
PATH_KEYS = (
    "ckpt_path",
    "output_dir",
    "data.path",
    "data.root",
    "backend.partition_dir",
    "hydra.run.dir",
    "hydra.sweep.dir",
)
_HYDRA_SPECIAL = set("=,[]{}()'\"\\ \t")


def hydra_quote(value: str) -> str:
    """``value`` as a Hydra override value: as it is when Hydra's grammar reads it back unchanged,
    else quoted (``'multirun/x/1_seed=1/last.pt'``)."""
    text = str(value)
    if text and not (set(text) & _HYDRA_SPECIAL):
        return text
    if "'" not in text:
        return f"'{text}'"
    if '"' not in text:
        return f'"{text}"'
    return "'" + text.replace("'", "\\'") + "'"


def hydra_override(key: str, value: str) -> str:
    """``key=value`` for a command line: quoted for Hydra (:func:`hydra_quote`) and for the shell,
    so it can be pasted as printed."""
    import shlex

    return shlex.quote(f"{key}={hydra_quote(value)}")


def quote_path_overrides(overrides: List[str], multirun: bool = False) -> List[str]:
    """The command line's overrides with the values of :data:`PATH_KEYS` quoted for Hydra where they
    hold a character its grammar reads otherwise (``ckpt_path=multirun/x/1_seed=1/last.pt``, which
    Hydra would refuse with ``mismatched input '='``). Under ``-m`` a value with a comma stays a
    sweep unless it is an existing path; an interpolation (``${...}``) is left alone."""
    import os

    out = []
    for arg in overrides:
        key, sep, value = arg.partition("=")
        if (
            sep
            and key.lstrip("+~") in PATH_KEYS
            and value
            and value[0] not in "'\""
            and "${" not in value
            and set(value) & _HYDRA_SPECIAL
            and not (multirun and "," in value and not os.path.exists(value))
        ):
            arg = f"{key}={hydra_quote(value)}"
        out.append(arg)
    return out


def register_data_dir(config_dir: Path) -> None:
    """Stores the schemas of the data options in ``config_dir`` (a user's ``--config-dir``'s ``data/``
    group) that select one in their ``defaults`` (``- /schema/data@_here_: <loader name>``), so such
    a file composes from the user's directory as from the package's. A loader that cannot be imported
    gets an open schema: the run then refuses it in one message when it checks the data config
    (:func:`revgnn.engine.preflight.check_data_config`). The working directory is put on the module
    path, as for ``imports``."""
    import os

    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    cs = ConfigStore.instance()
    for path in sorted(Path(config_dir).glob("*.yaml")):
        try:
            target = OmegaConf.load(path).get("_target_")
        except Exception:  # Hydra names a file it cannot read
            continue
        if not isinstance(target, str):
            continue
        _store_data_schema(cs, target)


def _store_data_schema(cs: ConfigStore, target: str) -> None:
    """Stores the schema of the loader ``target`` under its function's name; an open node when the
    loader cannot be imported or typed (the run's data check says why, in one message)."""
    name = target.rpartition(".")[2]
    try:
        node: Any = data_schema(target)
    except Exception:
        node = OmegaConf.create({"_target_": target}, flags={"struct": False})
    cs.store(group="schema/data", name=name, node=node)


def register_configs() -> None:
    """Stores the schemas in Hydra's ConfigStore and the run-directory resolvers (idempotent)."""
    for name, fn in (("revgnn.run_dir", _run_dir), ("revgnn.job_dir", _job_dir), ("revgnn.stamp", _stamp)):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    # open: the keys a variant accepts are its model class's arguments (checked at the start of a run)
    cs.store(
        group="schema/model", name="model", node=OmegaConf.structured(ModelConfig, flags={"struct": False})
    )
    # the package's variants, read from its source (no torch import), and any registered already (a
    # user's module imported before this one); a user's registered later are stored by import_modules
    registry = sys.modules.get("revgnn.models.registry")
    for name in {*builtin_model_names(), *(registry.list_models() if registry is not None else ())}:
        store_model_config(name)
    for path in sorted(_DATA_CONFIGS.glob("*.yaml")):
        # a loader that cannot be imported spoils only the runs that choose it (an open schema; the
        # run's data check names the import error), not every run
        target = OmegaConf.load(path).get("_target_")
        if isinstance(target, str):
            _store_data_schema(cs, target)
    cs.store(group="schema/optim", name="adam", node=AdamConfig)


register_configs()
