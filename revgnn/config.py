"""Structured schemas for the Hydra configuration (``revgnn/configs``).

Every YAML file is merged onto one of these dataclasses, so a misspelt key or a value of the wrong type
fails at composition time with an error that names the key, instead of being silently ignored.

* ``TrainConfig`` types the primary config (``train.yaml``) and its fixed groups ``trainer``, ``logger``
  and ``backend``.
* The ``data`` and ``optim`` groups have one schema per option (ogbn loaders and the generated data set
  take different arguments); an option selects its schema in its own ``defaults`` list, e.g.
  ``data/proteins_like.yaml`` starts with ``defaults: [/schema/data@_here_: proteins_like, _self_]``.
* ``model`` options use :class:`ModelConfig` (the overrides the zoo's factories share). A model family
  with options of its own may ship a YAML without that schema: ``revgnn.models.create_model`` rejects
  unknown overrides itself, naming them.

This module imports neither torch nor PyG, so ``revgnn-train --help`` and ``--cfg job`` stay fast.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

__all__ = [
    "TrainConfig",
    "TrainerConfig",
    "LoggerConfig",
    "BackendConfig",
    "ModelConfig",
    "ProteinsLikeConfig",
    "OgbnConfig",
    "MolLikeConfig",
    "OgbgConfig",
    "AdamConfig",
    "Device",
    "BackendName",
    "Precision",
    "register_configs",
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
    return field(default=default, metadata={"range": (low, high, low_open, high_open)})


def check_ranges(cfg: DictConfig, path: str = "") -> None:
    """Raises ``ValueError`` naming the key for every value outside the range its schema declares
    (:func:`ranged`); walks the whole config, whatever schema each node has."""
    schema = OmegaConf.get_type(cfg)
    if dataclasses.is_dataclass(schema):
        for f in dataclasses.fields(schema):
            bounds = f.metadata.get("range")
            value = cfg.get(f.name) if bounds else None
            if value is None or OmegaConf.is_missing(cfg, f.name):
                continue
            low, high, low_open, high_open = bounds
            too_low = low is not None and (value <= low if low_open else value < low)
            too_high = high is not None and (value >= high if high_open else value > high)
            if too_low or too_high:
                lo = "" if low is None else f"{'>' if low_open else '>='} {low}"
                hi = "" if high is None else f"{'<' if high_open else '<='} {high}"
                raise ValueError(
                    f"{path}{f.name} must be {' and '.join(b for b in (lo, hi) if b)}, got {value}"
                )
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
    """``auto``: bf16 autocast on CUDA, fp32 on CPU. ``bf16`` on CPU is allowed but slow."""

    auto = "auto"
    fp32 = "fp32"
    bf16 = "bf16"


@dataclass
class ModelConfig:
    """Arguments of :func:`revgnn.models.create_model`; ``None`` keeps the registered variant's default.

    ``in_channels``, ``out_channels``, ``edge_channels`` and ``species_channels`` come from the data set.
    """

    _target_: str = "revgnn.models.create_model"
    name: str = MISSING
    conv: Optional[str] = None
    num_layers: Optional[int] = ranged(None, 1)
    hidden_channels: Optional[int] = ranged(None, 1)
    num_groups: Optional[int] = ranged(None, 1)
    dropout: Optional[float] = ranged(None, 0, 1, high_open=True)
    aggr: Optional[str] = None
    norm: Optional[str] = None
    heads: Optional[int] = ranged(None, 1)
    keep_every: Optional[int] = ranged(None, 1)
    quantize: Optional[int] = ranged(None, 1)


@dataclass
class ProteinsLikeConfig:
    """Arguments of :func:`revgnn.data.synthetic.proteins_like` (its docstring explains each)."""

    _target_: str = "revgnn.data.synthetic.proteins_like"
    num_nodes: int = ranged(6000, 1)
    avg_degree: int = ranged(16, 1)
    window: int = ranged(20, 1)
    num_species: int = ranged(8, 1)
    num_tasks: int = ranged(112, 1)
    edge_channels: int = ranged(8, 1)
    latent_channels: int = ranged(4, 1)
    max_hops: int = ranged(6, 1)
    edge_noise: float = ranged(0.5, 0)
    valid_species: int = ranged(1, 0)
    test_species: int = ranged(2, 0)
    seed: int = 0


@dataclass
class OgbnConfig:
    """Arguments of :func:`revgnn.data.ogbn.load_ogbn`."""

    _target_: str = "revgnn.data.ogbn.load_ogbn"
    name: str = MISSING
    root: str = "data"
    allow_download: bool = False


@dataclass
class MolLikeConfig:
    """Arguments of :func:`revgnn.data.graph_dataset.mol_like` (its docstring explains each)."""

    _target_: str = "revgnn.data.graph_dataset.mol_like"
    num_graphs: int = ranged(2000, 1)
    min_nodes: int = ranged(12, 1)
    max_nodes: int = ranged(28, 1)
    distance: int = ranged(5, 1)
    hetero_atoms: int = ranged(2, 0)
    ring_prob: float = ranged(0.5, 0, 1)
    valid_fraction: float = ranged(0.1, 0, 1, high_open=True)
    test_fraction: float = ranged(0.1, 0, 1, high_open=True)
    batch_size: int = ranged(32, 1)
    seed: int = 0


@dataclass
class OgbgConfig:
    """Arguments of :func:`revgnn.data.graph_dataset.load_ogbg`."""

    _target_: str = "revgnn.data.graph_dataset.load_ogbg"
    name: str = MISSING
    root: str = "data"
    allow_download: bool = False
    batch_size: int = ranged(32, 1)


@dataclass
class AdamConfig:
    """``torch.optim.Adam``, built partially and completed with the model's parameters."""

    _target_: str = "torch.optim.Adam"
    _partial_: bool = True
    lr: float = ranged(1e-3, 0, low_open=True)
    weight_decay: float = ranged(0.0, 0)


@dataclass
class TrainerConfig:
    """The training loop's schedule (``revgnn/train.py``).

    Attributes:
        epochs: Passes over the graph; each draws a new random partition.
        train_parts: Parts ``K`` of that partition (its induced sub-graphs).
        parts_per_step: Parts per optimiser step, their gradients accumulated (the loss is the mean over
            all their labelled nodes); ``null``: one per worker (1 locally). Under ``backend=ddp`` a
            step's parts are dealt out, ``parts_per_step / workers`` each, so 2 workers equal one
            process with ``parts_per_step=2``.
        eval_every: Evaluate (and checkpoint "best") every this many epochs, and after the last one.
        eval_views: Independent random partitions at inference ``V``; logits are averaged over views.
        eval_parts: Parts per inference view (1 = the full graph at once).
        grad_clip: Max global gradient norm; 0 disables clipping.
        flat_params: Keep all parameters in one buffer and their gradients in another
            (:class:`revgnn.utils.flat.FlatParameters`), so the optimiser updates a few 4 MiB chunks
            rather than ~10 tensors per layer: the same update for element-wise optimisers (Adam,
            SGD, ...; others are refused), with a parameter that got no gradient treated as a zero
            gradient. At 1001 layers x 32 channels Adam's step takes 8-11 instead of 278-286 ms on CPU
            (``scripts/bench_optimizer.py``).

    ``train_parts``, ``eval_views`` and ``eval_parts`` concern node-level data (one big graph); graph-level
    data sets (``data=mol_like``, ``data=ogbg_molhiv``) are batched by their own ``data.batch_size``.
    """

    epochs: int = ranged(100, 1)
    train_parts: int = ranged(10, 1)
    parts_per_step: Optional[int] = ranged(None, 1)
    eval_every: int = ranged(1, 1)
    eval_views: int = ranged(1, 1)
    eval_parts: int = ranged(5, 1)
    grad_clip: float = ranged(1.0, 0)
    flat_params: bool = True


@dataclass
class LoggerConfig:
    """Outputs besides the always-written ``metrics.csv`` and ``summary.json``."""

    tensorboard: bool = False
    plot: bool = True
    progress_bar: bool = True


class BackendName(str, Enum):
    """``local``: one process. ``ddp``: data-parallel over the parts of each epoch's partition, one
    process per worker started by ``torchrun``. ``sar``: distributed full-graph training (SAR), one
    process per worker started by ``torchrun``, on a graph partitioned by ``revgnn-partition``."""

    local = "local"
    ddp = "ddp"
    sar = "sar"


@dataclass
class BackendConfig:
    """Execution backend (:mod:`revgnn.engine.backends`): device, numeric precision, CPU threads
    (``null``: the CPU affinity mask and cgroup quota, revgnn.utils.threads); for ``ddp`` and ``sar``
    the peer timeout (every wait is bounded by it) and the torch.distributed backend (``null``: gloo
    on CPU, NCCL on CUDA); for ``sar`` the partition directory."""

    name: BackendName = BackendName.local
    device: Device = Device.auto
    precision: Precision = Precision.auto
    num_threads: Optional[int] = ranged(None, 1)
    partition_dir: Optional[str] = None
    timeout_s: float = ranged(300.0, 0, low_open=True)
    dist_backend: Optional[str] = None


@dataclass
class TrainConfig:
    """The whole job. ``model``, ``data`` and ``optim`` are typed by their options' own schemas."""

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


def _run_dir(output_dir: Optional[str], default: str) -> str:
    """``hydra.run.dir`` / ``hydra.sweep.dir``: ``output_dir`` when set, so a run keeps all its files
    (checkpoints, ``.hydra/``, ``train.log``) in one directory."""
    return default if output_dir in (None, "") else str(output_dir)


def _swept_keys(argv: List[str]) -> List[str]:
    """Keys the command line sweeps (``k=a,b``, ``k=range(...)``, ``choice``, ``glob``, ``interval``)."""
    keys = []
    for arg in argv:
        if arg.startswith("-") or "=" not in arg:
            continue
        key, value = arg.split("=", 1)
        depth, top_comma = 0, False
        for ch in value:
            depth += ch in "[({"
            depth -= ch in "])}"
            top_comma |= ch == "," and depth == 0
        if top_comma or value.startswith(("range(", "choice(", "glob(", "interval(")):
            keys.append(key.lstrip("+~"))
    return keys


def _job_dir(num: Any, overrides: Any) -> str:
    """``hydra.sweep.subdir``: the job number and the values of the swept keys
    (``1_optim.lr=0.01``; all of the job's overrides when no sweep syntax is on the command line, e.g.
    a sweeper plugin), path separators replaced, so every job of a sweep over any key gets its own,
    readable directory (the job's full overrides are in its ``.hydra/overrides.yaml``)."""
    import sys

    items = [str(o) for o in overrides]
    swept = _swept_keys(sys.argv[1:])
    chosen = [o for o in items if o.split("=", 1)[0].lstrip("+~") in swept] or items
    name = "_".join([str(num)] + ([",".join(chosen)] if chosen else [])).replace("/", "_")
    if len(name) > 120:  # file systems cap names at 255 bytes; keep it readable and unique
        import hashlib

        name = f"{name[:100]}..{hashlib.sha1(name.encode()).hexdigest()[:10]}"
    return name


def register_configs() -> None:
    """Stores the schemas in Hydra's ConfigStore and the run-directory resolvers (idempotent)."""
    for name, fn in (("revgnn.run_dir", _run_dir), ("revgnn.job_dir", _job_dir)):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    cs.store(group="schema/model", name="model", node=ModelConfig)
    cs.store(group="schema/data", name="proteins_like", node=ProteinsLikeConfig)
    cs.store(group="schema/data", name="ogbn", node=OgbnConfig)
    cs.store(group="schema/data", name="mol_like", node=MolLikeConfig)
    cs.store(group="schema/data", name="ogbg", node=OgbgConfig)
    cs.store(group="schema/optim", name="adam", node=AdamConfig)


register_configs()
