"""Execution backends: what the one training loop asks of the processes that run it.

The loop (:func:`revgnn.engine.loop.train`) is the same for every backend; a backend supplies

* :meth:`Backend.start` / :meth:`Backend.close`: the device, and the process group if any;
* :meth:`Backend.make_task`: the data (the whole graph, or this worker's partition) as a task;
* :meth:`Backend.prepare_model`: convs switched to SAR, parameters broadcast from rank 0;
* :meth:`Backend.all_reduce` / :meth:`Backend.gather`: sums (the step's loss and stop flag, gradients,
  evaluation logits) and small objects (RNG states, peak memory) across workers;
* :attr:`Backend.is_writer`: rank 0 writes every file;
* :meth:`Backend.identity`: what a checkpoint must match to resume (backend, world size, partition);
* :meth:`Backend.check_config` / :meth:`Backend.check_start`: what it refuses, from the settings alone
  and for this process before the data loads (both run by :mod:`revgnn.engine.preflight`); a backend
  refuses nothing later, its task only what the loaded data shows.

Backends are chosen by name (``backend.name``, set by the ``backend`` group: ``backend=sar``) from
:data:`BACKENDS`: ``local`` (:class:`LocalBackend`, one process), ``ddp`` (:class:`DDPBackend`,
data-parallel over the parts of each epoch's partition, one ``torchrun`` process per worker) and ``sar``
(:class:`revgnn.engine.sar_backend.SARBackend`, full-graph over a partitioned graph, registered by its own
module, which the package ``revgnn.engine`` imports). A new backend is a :class:`Backend` subclass
decorated with :func:`register_backend`, in a module the run imports (the config's ``imports`` key).
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence, Union

import torch
from torch import Tensor

from revgnn.engine.tasks import OneWorker
from revgnn.utils.registry import Registry

__all__ = [
    "Backend",
    "LocalBackend",
    "DistributedBackend",
    "DDPBackend",
    "BACKENDS",
    "register_backend",
    "make_backend",
    "backend_class",
    "resolve_device",
]


class Backend(OneWorker):
    """Base class; see the module docstring for the contract. A backend is its task's
    :class:`~revgnn.engine.tasks.Workers`: one worker here, its process group's in
    :class:`DistributedBackend`."""

    name = "?"  # set by register_backend

    def __init__(self, cfg):
        self.cfg = cfg
        self.device = torch.device("cpu")

    @property
    def is_writer(self) -> bool:
        return self.rank == 0

    @classmethod
    def check_config(cls, cfg) -> None:
        """Refuses what this backend cannot run from the settings ``cfg`` alone, in any process (the
        one that launches a sweep too): nothing here. Raises :class:`~revgnn.errors.ConfigError`."""

    @classmethod
    def check_start(cls, cfg, level: Optional[str]) -> None:
        """Refuses what this process cannot run, before the data loads: a device that is not here
        (:func:`resolve_device`), then :meth:`check_task`. Raises :class:`~revgnn.errors.ConfigError`."""
        resolve_device(_value(cfg.backend.device))
        cls.check_task(cfg, level)

    @classmethod
    def check_task(cls, cfg, level: Optional[str]) -> None:
        """The trainer settings the task of data of ``level`` (``"node"``, ``"graph"``, where the
        loader declares it, :func:`~revgnn.engine.tasks.data_level`) refuses with
        :meth:`world_size` workers; ``None``: the task checks them once the data has loaded."""
        from revgnn.engine.tasks import TASKS

        if level is not None:
            name = cfg.data.get("name") or str(cfg.data._target_).rpartition(".")[2]
            TASKS[level].check_trainer(cfg.trainer, cls.expected_world_size(), name)

    @classmethod
    def expected_world_size(cls) -> int:
        """The workers this process will train with, known before it starts."""
        return 1

    def start(self) -> torch.device:
        """Chooses the device (and joins the process group); returns the device."""
        b = self.cfg.backend
        from revgnn.utils.threads import configure_threads  # null: affinity mask and cgroup quota

        configure_threads(b.num_threads, warn=False)
        self.device = resolve_device(_value(b.device))
        return self.device

    def close(self, ok: bool) -> None:
        """Leaves the process group (``ok``: after a clean end)."""

    def make_task(self):
        """The task of the configured data set (``data`` group)."""
        from hydra.utils import instantiate

        from revgnn.engine.tasks import make_task

        ds = instantiate(self.cfg.data)
        # a loader of one's own may return a PyG Data: named after its function
        return make_task(ds, self.cfg.trainer, self, name=str(self.cfg.data._target_).rpartition(".")[2])

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model

    def reduce_gradients(self, grads: Union[Tensor, Sequence[torch.nn.Parameter]]) -> None:
        """Sums the gradients over workers: the flat gradient buffer, or the parameters' ``.grad``."""

    def identity(self) -> Dict[str, Any]:
        """What a checkpoint records of the backend and a resume must match."""
        return {"backend": self.name, "world_size": self.world_size}

    def launch_prefix(self) -> str:
        """The command that starts this job again (for the resume hint)."""
        return "revgnn-train"


def _value(setting: Any) -> Any:
    """A setting's value (an enum member's value)."""
    return getattr(setting, "value", setting)


def _check_backend(name: str, cls: type) -> type:
    """The registry's entry for ``cls``: itself, a :class:`Backend` subclass whose ``name`` is ``name``
    (what checkpoints record and resumes compare)."""
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise TypeError(f"register_backend({name!r}) decorates a Backend subclass, got {cls!r}")
    cls.name = name
    return cls


#: name -> :class:`Backend` subclass of every registered backend (``backend.name``).
BACKENDS: Registry = Registry("backend", _check_backend, how_to_add="add your own with register_backend")


def register_backend(name: str):
    """Class decorator registering a :class:`Backend` subclass as ``backend.name=<name>``; sets the
    class's ``name`` (what checkpoints record of the backend) to it."""
    return BACKENDS.register(name)


@register_backend("local")
class LocalBackend(Backend):
    """One process: the whole graph on one device."""

    @classmethod
    def check_start(cls, cfg, level: Optional[str]) -> None:
        """Also refuses a process that ``torchrun`` started as one of several: each would train alone
        into the same files."""
        from revgnn.errors import ConfigError

        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world > 1:
            raise ConfigError(
                f"this process is one of {world} torchrun workers but backend=local trains "
                f"in one process; use backend=ddp (data-parallel over parts) or backend=sar "
                f"(full-graph over a partitioned graph)"
            )
        super().check_start(cfg, level)


class DistributedBackend(Backend):
    """Base of the ``torchrun`` backends: one process per worker, a ``torch.distributed`` group
    (gloo on CPU, NCCL on CUDA) with every wait bounded by ``backend.timeout_s``."""

    #: what ``torchrun`` (or a launcher doing its job) sets for every worker
    LAUNCH_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

    @classmethod
    def check_start(cls, cfg, level: Optional[str]) -> None:
        """Also refuses a process that ``torchrun`` did not start (no peer would come) and NCCL
        (``backend.dist_backend=nccl``) without a CUDA device."""
        import torch.distributed as dist

        from revgnn.errors import ConfigError

        missing = [k for k in cls.LAUNCH_ENV if k not in os.environ]
        if missing and not dist.is_initialized():  # a plain `revgnn-train backend=...`
            raise ConfigError(
                f"backend={cls.name} runs one process per worker, started by torchrun: launch it "
                f"as `torchrun --nproc_per_node={cls.num_workers_hint(cfg)} -m revgnn.train "
                f"backend={cls.name} ...` (this process has no {', '.join(missing)} in its "
                f"environment, so it was not started by torchrun)"
            )
        super().check_start(cfg, level)
        # a choice of the schema (DistBackend): Hydra refused any other value before the run
        device = resolve_device(_value(cfg.backend.device))
        if _value(cfg.backend.dist_backend) == "nccl" and device.type != "cuda":
            raise ConfigError("backend.dist_backend=nccl moves CUDA tensors only; use gloo on CPU")

    @classmethod
    def expected_world_size(cls) -> int:
        """``torchrun``'s ``WORLD_SIZE`` (or the process group's, where one is already joined)."""
        import torch.distributed as dist

        return dist.get_world_size() if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", "1"))

    def start(self) -> torch.device:
        import torch.distributed as dist

        from revgnn.distributed.comm import init_distributed

        b = self.cfg.backend
        device = super().start()
        dist_backend = _value(b.dist_backend) or ("nccl" if device.type == "cuda" else "gloo")
        if device.type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
            self.device = device = torch.device("cuda", torch.cuda.current_device())
        init_distributed(backend=dist_backend, timeout_s=b.timeout_s)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        return device

    def close(self, ok: bool) -> None:
        import torch.distributed as dist

        if not dist.is_initialized():
            return
        if ok:  # everyone done before rank 0's files count as final; never after a failure (it would hang)
            from revgnn.distributed.comm import barrier

            barrier("the final barrier after training")
        dist.destroy_process_group()

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        from revgnn.distributed.comm import broadcast_parameters

        broadcast_parameters(model)
        return model

    def all_reduce(self, t: Tensor, what: str = "all_reduce") -> Tensor:
        from revgnn.distributed.comm import all_reduce_sum

        if self.device.type == "cuda" and t.device.type != "cuda":  # NCCL reduces CUDA tensors only
            return all_reduce_sum(t.to(self.device), what).to(t.device)
        return all_reduce_sum(t, what)

    def gather(self, obj: Any, what: str = "all_gather") -> List[Any]:
        from revgnn.distributed.comm import all_gather_object_checked

        return all_gather_object_checked(obj, what)

    def reduce_gradients(self, grads) -> None:
        from revgnn.distributed.comm import all_reduce_gradients, all_reduce_sum

        if isinstance(grads, Tensor):
            all_reduce_sum(grads, "gradient all-reduce")
        else:
            all_reduce_gradients(list(grads))

    @classmethod
    def num_workers_hint(cls, cfg) -> str:
        """``P`` of the launch command the error of a process not started by ``torchrun`` names."""
        return "P"

    def launch_prefix(self) -> str:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", self.world_size))
        nodes = max(self.world_size // max(local, 1), 1)
        prefix = f"torchrun --nproc_per_node={local}"
        if nodes > 1:
            prefix += f" --nnodes={nodes} --rdzv_endpoint=<host:port>"
        return prefix + " -m revgnn.train"


@register_backend("ddp")
class DDPBackend(DistributedBackend):
    """Data-parallel training over parts: every worker holds the whole graph and draws the same
    random partition each epoch; a step's ``trainer.parts_per_step`` parts are dealt out,
    ``parts_per_step / world_size`` per worker, and the flat gradient is all-reduced, so ``W`` workers
    take exactly the step one process takes with ``trainer.parts_per_step`` (tested in float64)."""


def resolve_device(name: str, setting: str = "backend.device") -> torch.device:
    """The device ``name`` (``auto``, ``cpu``, ``cuda`` or ``cuda:N``) stands for: ``auto`` is CUDA
    when it is available, else the CPU; CUDA without CUDA, or a name torch does not know, is a
    :class:`~revgnn.errors.ConfigError` naming ``setting``, the option that asked for it
    (``backend.device``, ``revgnn-evaluate --device``)."""
    from revgnn.errors import ConfigError

    cuda = torch.cuda.is_available()
    if name == "auto":
        name = "cuda" if cuda else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"{setting}={name} is no device; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not cuda:
        raise ConfigError(f"{setting}={name} but CUDA is not available; use {setting}=auto or cpu")
    return device


def backend_class(name: str) -> type:
    """The :class:`Backend` subclass registered as ``name``; an unknown name is a
    :class:`~revgnn.errors.ConfigError` listing the registered ones."""
    from revgnn.errors import ConfigError

    if name not in BACKENDS:
        raise ConfigError(str(BACKENDS.unknown(name, prefix="backend.name: ")))
    return BACKENDS.get(name)


def make_backend(cfg) -> Backend:
    """The backend named by ``cfg.backend.name`` (:func:`backend_class`), for ``cfg``."""
    return backend_class(cfg.backend.name)(cfg)
