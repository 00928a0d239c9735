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

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

__all__ = ["TrainConfig", "TrainerConfig", "LoggerConfig", "BackendConfig", "ModelConfig",
           "ProteinsLikeConfig", "OgbnConfig", "MolLikeConfig", "OgbgConfig", "AdamConfig", "Device",
           "BackendName",
           "Precision", "register_configs"]


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
    num_layers: Optional[int] = None
    hidden_channels: Optional[int] = None
    num_groups: Optional[int] = None
    dropout: Optional[float] = None
    aggr: Optional[str] = None
    norm: Optional[str] = None
    heads: Optional[int] = None
    keep_every: Optional[int] = None
    quantize: Optional[int] = None


@dataclass
class ProteinsLikeConfig:
    """Arguments of :func:`revgnn.data.synthetic.proteins_like` (its docstring explains each)."""
    _target_: str = "revgnn.data.synthetic.proteins_like"
    num_nodes: int = 6000
    avg_degree: int = 16
    window: int = 20
    num_species: int = 8
    num_tasks: int = 112
    edge_channels: int = 8
    latent_channels: int = 4
    max_hops: int = 6
    edge_noise: float = 0.5
    valid_species: int = 1
    test_species: int = 2
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
    """Arguments of :func:`revgnn.data.graphs.mol_like` (its docstring explains each)."""
    _target_: str = "revgnn.data.graphs.mol_like"
    num_graphs: int = 2000
    min_nodes: int = 12
    max_nodes: int = 28
    distance: int = 5
    hetero_atoms: int = 2
    ring_prob: float = 0.5
    valid_fraction: float = 0.1
    test_fraction: float = 0.1
    batch_size: int = 32
    seed: int = 0


@dataclass
class OgbgConfig:
    """Arguments of :func:`revgnn.data.graphs.load_ogbg`."""
    _target_: str = "revgnn.data.graphs.load_ogbg"
    name: str = MISSING
    root: str = "data"
    allow_download: bool = False
    batch_size: int = 32


@dataclass
class AdamConfig:
    """``torch.optim.Adam``, built partially and completed with the model's parameters."""
    _target_: str = "torch.optim.Adam"
    _partial_: bool = True
    lr: float = 1e-3
    weight_decay: float = 0.0


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
    epochs: int = 100
    train_parts: int = 10
    parts_per_step: Optional[int] = None
    eval_every: int = 1
    eval_views: int = 1
    eval_parts: int = 5
    grad_clip: float = 1.0
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
    (``null``: torch's default); for ``ddp`` and ``sar`` the peer timeout (every wait is bounded by
    it) and the torch.distributed backend (``null``: gloo on CPU, NCCL on CUDA); for ``sar`` the
    partition directory."""
    name: BackendName = BackendName.local
    device: Device = Device.auto
    precision: Precision = Precision.auto
    num_threads: Optional[int] = None
    partition_dir: Optional[str] = None
    timeout_s: float = 300.0
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
    output_dir: Optional[str] = None


def register_configs() -> None:
    """Stores the schemas in Hydra's ConfigStore (idempotent)."""
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    cs.store(group="schema/model", name="model", node=ModelConfig)
    cs.store(group="schema/data", name="proteins_like", node=ProteinsLikeConfig)
    cs.store(group="schema/data", name="ogbn", node=OgbnConfig)
    cs.store(group="schema/data", name="mol_like", node=MolLikeConfig)
    cs.store(group="schema/data", name="ogbg", node=OgbgConfig)
    cs.store(group="schema/optim", name="adam", node=AdamConfig)


register_configs()
