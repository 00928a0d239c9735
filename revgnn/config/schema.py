"""The typed schemas of the Hydra configuration (``revgnn/configs``), and the checks that read them.

Every YAML file is merged onto one of these dataclasses, so a misspelt key or a value of the wrong type
fails at composition time with an error that names the key, instead of being silently ignored.

* :class:`TrainConfig` types the primary config (``train.yaml``) and its fixed groups ``trainer``,
  ``logger`` and ``backend``; a key added with Hydra's ``+key=value``, which composition lets through,
  is refused when the run starts (:func:`check_keys`).
* A field with a range (:func:`ranged`) is checked by :func:`check_ranges`, which also reads the ranges
  of the data schemas (:mod:`revgnn.config.data_options`).
* The ``optim`` group has one schema per option; a ``model`` option is the open :class:`ModelConfig`.

This module imports OmegaConf but neither Hydra nor torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, List, Optional

from omegaconf import MISSING, DictConfig, OmegaConf

from revgnn.errors import ConfigError
from revgnn.utils.ranges import Range

__all__ = [
    "TrainConfig",
    "TrainerConfig",
    "LoggerConfig",
    "BackendConfig",
    "ModelConfig",
    "AdamConfig",
    "Device",
    "Precision",
    "DistBackend",
    "PartitionMode",
    "ranged",
    "check_keys",
    "check_ranges",
]


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
