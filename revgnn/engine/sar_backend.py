r"""``backend=sar``: full-graph training on a partitioned graph, one ``torchrun`` process per part.

    revgnn-partition data=proteins_like num_parts=4 method=metis out=parts/pl4
    torchrun --nproc_per_node=4 -m revgnn.train backend=sar backend.partition_dir=parts/pl4

Each worker loads only its part (checked against ``meta.json`` and agreed on by all workers before the
first step), builds its :class:`~revgnn.distributed.sar.SARGraph` and switches the model's convs to SAR
(:func:`~revgnn.distributed.convs.convert_to_sar`); parameters are broadcast from rank 0. An epoch is one
full-graph step: worker :math:`p`'s loss is normalised by the *global* number of labelled entries,

.. math::
    L_p = \frac{1}{n} \sum_{(i, t) \in \mathcal{L}_p} \ell(\hat{y}_{it}, y_{it}),

so the all-reduced sum of the per-worker gradients is the single-process full-graph gradient of the
mean loss. Evaluation gathers every split's predictions and runs the OGB Evaluator on every worker
(the same numbers everywhere); the final test of ``best.pt`` (``trainer.test_views=1``) is one more
such full-graph evaluation, with every worker loading the checkpoint. Everything else (checkpoints,
exact resume, NaN guard, precision, logging, signals) is the one loop's, :mod:`revgnn.engine.loop`.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Iterator, Optional

import torch
from torch import nn

from revgnn.engine.backends import DistributedBackend, register_backend
from revgnn.engine.tasks import (
    Batch,
    NodeLevelTask,
    Step,
    autocast_or_null,
    check_whole_graph_test,
    labelled_entries,
    model_shapes,
)

__all__ = ["SARTask", "SARBackend"]

log = logging.getLogger("revgnn.train")

#: trainer keys that describe sub-graph training and multi-view inference, which SAR replaces.
_FULL_GRAPH = {"train_parts": 1, "eval_views": 1, "eval_parts": 1, "test_parts": 1}


class SARTask(NodeLevelTask):
    """This worker's share of a full-graph node task (see the module docstring): a
    :class:`~revgnn.engine.tasks.NodeLevelTask` (its loss, scorer and model shapes) whose one step per
    epoch and evaluation are the full graph's, over every worker.

    Args:
        graph (SARGraph): The worker's part and communication plan (on ``device``).
        meta (dict): The partition's ``meta.json`` (its ``dataset`` entry names the task, the
            evaluator, the class count and the species channels).
        workers (Workers): This worker and its peers (:class:`~revgnn.engine.tasks.Workers`; the
            SAR backend): the step's entry count is summed over them, predictions gathered from them.
        device: Where the model lives.
    """

    def __init__(self, graph, meta: Dict[str, Any], workers, device):
        from revgnn.engine.inference import Scorer

        info = meta.get("dataset", {})
        nd = graph.node_data
        for key in ("x", "y", "train_mask"):
            if key not in nd:
                raise ValueError(f"the partition has no node tensor {key!r}; partition with revgnn-partition")
        if not info.get("evaluator"):
            raise ValueError(
                "the partition's meta.json names no OGB evaluator; partition with revgnn-partition"
            )
        task = info.get("task", "multilabel")
        edge_channels = None if graph.edge_attr is None else graph.edge_attr.size(1)
        out_channels = info.get("num_classes", nd["y"].size(1))
        shapes = model_shapes(nd["x"].size(1), out_channels, edge_channels, info.get("species_channels", 0))
        super().__init__(info.get("name", "?"), task, Scorer(info["evaluator"], task), shapes)
        self.graph, self.workers, self.device = graph, workers, device
        self.x, self.y = nd["x"].to(device), nd["y"].to(device)
        self.masks = {k[:-5]: v.to(device) for k, v in nd.items() if k.endswith("_mask")}
        self.edge_attr = None if graph.edge_attr is None else graph.edge_attr.to(device)
        train = self.masks["train"]
        self.count = int(labelled_entries(self.y[train]).sum())
        entries = torch.tensor([float(self.count)], dtype=torch.float64)
        self.total = int(workers.all_reduce(entries, "all_reduce of the labelled entries").item())

    @staticmethod
    def check_trainer(tc) -> None:
        """Refuses trainer settings of sub-graph training and multi-view inference, which the full
        graph replaces (``backend/sar.yaml`` sets them). Raises :class:`~revgnn.errors.ConfigError`."""
        from revgnn.errors import ConfigError

        check_whole_graph_test(tc, "backend=sar")
        bad = {k: tc[k] for k, v in _FULL_GRAPH.items() if tc[k] != v}
        if tc.parts_per_step not in (None, 1):
            bad["parts_per_step"] = tc.parts_per_step
        if bad:
            raise ConfigError(
                f"backend=sar trains and evaluates on the full graph, one step per epoch; "
                f"{', '.join(f'trainer.{k}={v}' for k, v in bad.items())} cannot apply: set "
                f"{' '.join(f'trainer.{k}=1' for k in bad)} (backend/sar.yaml sets them)"
            )

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.name}, {self.graph})"

    def train_steps(self, generator: torch.Generator, device, start: int = 0) -> Iterator[Step]:
        """One full-graph step per epoch; every worker takes it, labelled nodes or not (the forward
        and backward are collective)."""
        if start == 0 and self.total > 0:
            mask = self.masks["train"]
            yield Step(
                0,
                iter([Batch((self.x, self.graph, self.edge_attr), mask, self.y[mask], self.count)]),
                self.total,
            )

    @torch.no_grad()
    def evaluate(self, model: nn.Module, generator, device, autocast=None) -> Dict[str, float]:
        was_training = model.training
        model.eval()
        with autocast_or_null(autocast):
            out = model(self.x, self.graph, self.edge_attr).float().cpu()
        model.train(was_training)
        pieces = {
            s: (out[m.cpu()], self.y[m].cpu())
            for s, m in self.masks.items()
            if s in ("train", "valid", "test")
        }
        from revgnn.engine.divergence import check_predictions

        gathered = self.workers.gather(pieces, "all_gather of the evaluation's predictions")
        pred = {s: torch.cat([g[s][0] for g in gathered]) for s in pieces}
        check_predictions(pred)  # all of every split, the same on every worker
        return {s: self.scorer.score(torch.cat([g[s][1] for g in gathered]), pred[s]) for s in pieces}

    def fix_eval_views(self, generator) -> None:
        """The full graph is scored deterministically: there is no random view to fix."""

    def final_test(self, model: nn.Module, generator, device, autocast=None) -> Dict[str, float]:
        """The final test of a checkpoint: :meth:`evaluate` on the full graph (every worker takes part)."""
        return self.evaluate(model, generator, device, autocast)


@register_backend("sar")
class SARBackend(DistributedBackend):
    """SAR full-graph training: the graph comes from ``backend.partition_dir`` (written by
    ``revgnn-partition``), not from the ``data`` group."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.fingerprint = None

    @classmethod
    def check_config(cls, cfg) -> None:
        """Refuses ``trainer.compile``, a missing ``backend.partition_dir`` and the trainer settings
        the full graph replaces (:meth:`SARTask.check_trainer`)."""
        from omegaconf import OmegaConf

        from revgnn.errors import ConfigError

        if cfg.trainer.compile:
            raise ConfigError(
                "trainer.compile=true is not supported with backend=sar: its ring communication runs "
                "inside autograd functions that torch.compile does not trace; use backend=local or ddp"
            )
        if OmegaConf.is_missing(cfg.backend, "partition_dir") or not cfg.backend.partition_dir:
            raise ConfigError(
                "backend=sar needs backend.partition_dir=DIR, a directory written by "
                "`revgnn-partition data=... num_parts=P out=DIR`"
            )
        SARTask.check_trainer(cfg.trainer)

    @classmethod
    def check_task(cls, cfg, level: Optional[str]) -> None:
        """The task is the partition's, whatever the data level: the ``data`` group must describe the
        partitioned data set (never silently another one), read from its ``meta.json``."""
        from omegaconf import OmegaConf

        from revgnn.distributed.part_files import load_meta
        from revgnn.errors import ConfigError

        root = cfg.backend.partition_dir
        try:
            info = load_meta(root).get("dataset", {})
        except Exception:  # the partition's own checks report it when this worker loads its part
            return
        saved = info.get("config")
        if saved is None:
            log.warning(
                "%s was written without its data config (partition_dataset without data_config): "
                "the data group is not checked against it",
                root,
            )
            return
        now = OmegaConf.to_container(cfg.data, resolve=True)
        diff = [
            f"data.{k}: {saved.get(k)!r} in the partition, {now.get(k)!r} here"
            for k in sorted(set(saved) | set(now))
            if saved.get(k) != now.get(k)
        ]
        if diff:
            raise ConfigError(
                f"backend=sar trains on the graph in {root}, but the data group describes another "
                f"one ({'; '.join(diff)}): select the partitioned data set (e.g. "
                f"data={info.get('name')}) or partition this one with revgnn-partition"
            )

    @classmethod
    def num_workers_hint(cls, cfg) -> str:
        """The partition's number of parts (one worker each), or ``P`` if ``meta.json`` is unreadable."""
        from revgnn.distributed.part_files import load_meta

        try:
            return str(int(load_meta(cfg.backend.partition_dir)["num_parts"]))
        except Exception:  # the partition's own checks report it once the job is launched
            return "P"

    def make_task(self) -> SARTask:
        from revgnn.distributed.part_files import load_meta, load_partition_checked
        from revgnn.distributed.sar import SARGraph

        root = self.cfg.backend.partition_dir
        part = load_partition_checked(root)
        graph = SARGraph(part, timeout_s=self.cfg.backend.timeout_s).to(self.device)
        self.fingerprint = part["fingerprint"]
        return SARTask(graph, load_meta(root), self, self.device)

    def prepare_model(self, model: nn.Module) -> nn.Module:
        from revgnn.distributed.convs import convert_to_sar

        convert_to_sar(model)
        return super().prepare_model(model)

    def identity(self) -> Dict[str, Any]:
        return {**super().identity(), "partition": self.fingerprint}
