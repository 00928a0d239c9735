r"""What the training loop needs to know about a data set: its steps, their loss and its evaluation.

A task turns a data set into optimiser *steps*, each a list of batches, computes each batch's share of
the step's loss and scores a model on every split with OGB's evaluator, so that
:func:`revgnn.engine.loop.train` is one loop for every level and backend:

* :class:`NodeTask` (a :class:`~revgnn.data.node_dataset.NodeDataset`, e.g. ogbn-proteins): every epoch a new
  random partition into ``trainer.train_parts`` parts (``trainer.partition``: balanced or uniform), visited
  in order or shuffled (``trainer.shuffle_parts``); a step takes ``trainer.parts_per_step`` of them
  (their induced sub-graphs, the loss on their training nodes, the gradients accumulated). Under
  ``backend=ddp`` every worker draws the same partition and the step's parts are dealt out, so
  :math:`W` workers with :math:`K/W` parts each take the step one process takes with :math:`K`.
  Evaluation is multi-view inference (``trainer.eval_views`` x ``trainer.eval_parts``, fresh views each
  time or views fixed once by :meth:`NodeTask.fix_eval_views`), the final test of the best checkpoint
  the same with ``trainer.test_views`` x ``trainer.test_parts`` (:meth:`NodeTask.final_test`); their
  forwards are dealt out the same way.
* :class:`GraphTask` (a :class:`~revgnn.data.graph_dataset.GraphDataset`, e.g. ogbg-molhiv): every epoch the
  training graphs are shuffled into batches of ``data.batch_size``, one step each; the model is called
  as ``model(x, edge_index, edge_attr, batch, num_graphs)`` and returns one row per graph.
* :class:`~revgnn.engine.sar_backend.SARTask`: one full-graph step per epoch on every SAR worker.

What a node-level task is by its data (its loss, its scorer, the model's data-dependent arguments) is
:class:`NodeLevelTask`, which :class:`NodeTask` and the SAR task share; how its steps and evaluations
are cut depends on the process layout. What a task refuses in the trainer settings is checked before
the run starts (:meth:`NodeTask.check_trainer`, :meth:`GraphTask.check_trainer`, reached from
:func:`revgnn.engine.preflight.check_before_start` through the backend), and again at construction
for data whose level only the loaded data tells.

Every task follows the :class:`Task` protocol; the collectives it needs (its :class:`Workers`: rank,
world size, all-reduce, all-gather; a backend is one) are given once, at construction, and
:data:`ONE_WORKER` serves a single process.

The loss of a step :math:`s` over its batches :math:`b` (on every worker) is the mean over all of its
labelled entries,

.. math::
    L_s = \frac{1}{n_s} \sum_{b \in s} \sum_{(i, t) \in b} \ell(\hat{y}_{it}, y_{it}),

where :math:`n_s` (:attr:`Step.total`) counts the labelled entries of the whole step: each batch
contributes ``loss_sum / n_s``, so accumulated (or all-reduced) gradients are those of :math:`L_s`.
``multilabel`` data use BCE-with-logits over tasks (NaN labels are ignored, as OGB's molecule sets
have missing labels), ``multiclass`` data cross entropy.
"""

from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, List, NamedTuple, Optional, Protocol, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "Batch",
    "Step",
    "Task",
    "Workers",
    "OneWorker",
    "ONE_WORKER",
    "NodeLevelTask",
    "NodeTask",
    "GraphTask",
    "make_task",
    "task_loss",
    "labelled_entries",
    "shapes",
    "model_shapes",
    "data_level",
]


class Batch(NamedTuple):
    """One forward pass: the model's positional inputs, which output rows the loss uses (a mask, or
    :obj:`None` for all), their targets and how many labelled entries they hold."""

    inputs: Tuple[Any, ...]
    select: Optional[Tensor]
    y: Tensor
    count: int


class Step(NamedTuple):
    """One optimiser step: its index in the epoch, this worker's batches (an iterator: sub-graphs are
    built one at a time) and the labelled entries of the whole step, over all batches and workers."""

    index: int
    batches: Iterator[Batch]
    total: int


class Workers(Protocol):
    """The workers a task runs on and their collectives (:class:`~revgnn.engine.backends.Backend` is
    one; ``what`` names an operation in a failure's error)."""

    rank: int
    world_size: int

    def all_reduce(self, t: Tensor, what: str = "all_reduce") -> Tensor: ...

    def gather(self, obj: Any, what: str = "all_gather") -> List[Any]: ...


class OneWorker:
    """:class:`Workers` of a single process: sums and gathers over itself."""

    rank, world_size = 0, 1

    def all_reduce(self, t: Tensor, what: str = "all_reduce") -> Tensor:
        """Sum over workers (in place where possible); returns the sum. ``what`` names the operation
        in a failure's error."""
        return t

    def gather(self, obj: Any, what: str = "all_gather") -> List[Any]:
        """``obj`` of every worker, by rank (``what`` as for :meth:`all_reduce`)."""
        return [obj]


#: The workers of a one-process run (``revgnn-evaluate``, a local backend, tests).
ONE_WORKER = OneWorker()


class Task(Protocol):
    """What the loop needs of a data set (see the module docstring): its shapes, its steps, their
    loss, and its scores. ``train_steps`` and ``loss`` are all a training step uses
    (:func:`revgnn.engine.loop.train_step`); the loop evaluates with the rest."""

    level: str  #: ``"node"`` or ``"graph"``
    name: str
    metric: str  #: the OGB evaluator's metric
    shapes: Dict[str, Any]  #: the model's data-dependent arguments (:func:`shapes`)

    def train_steps(self, generator: torch.Generator, device, start: int = 0) -> Iterator["Step"]: ...

    def loss(self, logits: Tensor, batch: "Batch", total: int) -> Tensor: ...

    def fix_eval_views(self, generator: torch.Generator) -> None: ...

    def evaluate(self, model: nn.Module, generator, device, autocast=None) -> Dict[str, float]: ...

    def final_test(self, model: nn.Module, generator, device, autocast=None) -> Dict[str, float]: ...


def task_loss(logits: Tensor, y: Tensor, task: str, reduction: str = "mean") -> Tensor:
    """BCE-with-logits over labelled entries (``multilabel``; NaN = unlabelled), squared error over
    them (``regression``) or cross entropy;
    ``reduction`` is ``"mean"`` or ``"sum"`` over those entries. Half-precision logits (autocast)
    are scored in float32; float64 stays float64."""
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    if task in ("multilabel", "regression"):
        y = y.to(logits.dtype)
        labelled = y == y
        if task == "regression":
            return F.mse_loss(logits[labelled], y[labelled], reduction=reduction)
        return F.binary_cross_entropy_with_logits(logits[labelled], y[labelled], reduction=reduction)
    return F.cross_entropy(logits, y.view(-1), reduction=reduction)


def labelled_entries(y: Tensor) -> Tensor:
    """Labelled entries per row of ``y``: the non-NaN entries of float targets, 1 per row of classes."""
    if y.is_floating_point():
        labelled = y == y
        return labelled.flatten(1).sum(1) if y.dim() > 1 else labelled.long()
    return torch.ones(y.size(0), dtype=torch.long, device=y.device)


def autocast_or_null(ctx):
    """``ctx`` (an autocast context of the run's precision) or a no-op context where it is None."""
    return ctx if ctx is not None else contextlib.nullcontext()


def trainer_option(tc, key: str, default: Any) -> Any:
    """``tc[key]`` (an enum as its value), or ``default`` for a config that predates the key (e.g. a
    checkpoint's saved config)."""
    value = tc.get(key, default) if hasattr(tc, "get") else getattr(tc, key, default)
    return getattr(value, "value", value)


def check_whole_graph_test(tc, where: str) -> None:
    """The final test of a whole-graph evaluation (graph-level data, SAR) has one view. Raises
    :class:`~revgnn.errors.ConfigError`."""
    from revgnn.errors import ConfigError

    views = trainer_option(tc, "test_views", None)
    if views not in (None, 1):
        raise ConfigError(
            f"{where} evaluates whole graphs, one deterministic view: trainer.test_views={views} "
            f"cannot apply; set trainer.test_views=1 (test best.pt once) or null (no final test)"
        )


class NodeLevelTask:
    """What a node-level task is by its data, whatever the process layout: a step's loss over the
    labelled entries of its batches (:func:`task_loss`, summed and divided by the step's count), its
    scorer and the model's data-dependent arguments (:attr:`shapes`). :class:`NodeTask` (random
    parts of the whole graph) and :class:`~revgnn.engine.sar_backend.SARTask` (one SAR worker's part of
    the full graph) add how steps and evaluations are cut.

    Args:
        name (str): The data set's name.
        task (str): ``multilabel``, ``multiclass`` or ``regression``.
        scorer (Scorer): Scores logits (:class:`revgnn.engine.inference.Scorer`).
        shapes (dict): The model's data-dependent arguments (:func:`model_shapes`).
    """

    level = "node"

    def __init__(self, name: str, task: str, scorer, shapes: Dict[str, Any]):
        self.name, self.task, self.shapes = name, task, shapes
        self.scorer, self.metric = scorer, scorer.metric

    def loss(self, logits: Tensor, batch: Batch, total: int) -> Tensor:
        """This batch's share of the step loss: its summed loss over the step's labelled entries."""
        return task_loss(logits[batch.select], batch.y, self.task, "sum") / total


class NodeTask(NodeLevelTask):
    """Node-level training on random-partition sub-graphs of one big graph (Li et al., ICML 2021).

    Args:
        ds (NodeDataset): The graph.
        trainer_cfg: ``trainer`` config (``train_parts``, ``parts_per_step``, ``partition``,
            ``shuffle_parts``, ``eval_views``, ``eval_parts``, ``test_views``, ``test_parts``).
        workers (Workers): The workers sharing each step under ``backend=ddp``, which deal out its
            parts and the evaluation's forwards (default: :data:`ONE_WORKER`).
    """

    def __init__(self, ds, trainer_cfg, workers: Workers = ONE_WORKER):
        from revgnn.engine.inference import Scorer

        super().__init__(ds.name, ds.task, Scorer.for_dataset(ds), shapes(ds))
        self.ds, self.tc, self.workers = ds, trainer_cfg, workers
        self.rank, self.world_size = workers.rank, workers.world_size
        self.train_mask = torch.zeros(ds.num_nodes, dtype=torch.bool)
        self.train_mask[ds.split_idx["train"]] = True
        self.entries = labelled_entries(ds.y) * self.train_mask  # loss terms per node
        self.check_trainer(trainer_cfg, self.world_size)
        self.parts_per_step = trainer_cfg.parts_per_step or self.world_size
        self.partition = trainer_option(trainer_cfg, "partition", "balanced")
        self.shuffle_parts = bool(trainer_option(trainer_cfg, "shuffle_parts", False))
        self.eval_views: Optional[list] = None  # fixed evaluation views (fix_eval_views)

    @staticmethod
    def check_trainer(tc, world_size: int, name: str = "the data set") -> None:
        """Refuses trainer settings that cannot cut steps of random parts over ``world_size`` workers:
        ``parts_per_step`` (``null``: one per worker) a multiple of the workers and a divisor of
        ``train_parts``. Raises :class:`~revgnn.errors.ConfigError` (``name``, the data set's, is
        not needed to say why)."""
        from revgnn.errors import ConfigError

        k = tc.parts_per_step or world_size
        if k % world_size:
            raise ConfigError(
                f"trainer.parts_per_step={k} must be a multiple of the {world_size} workers "
                f"(each worker takes parts_per_step / workers parts per step)"
            )
        if tc.train_parts % k:
            raise ConfigError(
                f"trainer.train_parts={tc.train_parts} must be a multiple of trainer.parts_per_step={k}"
            )

    def __repr__(self) -> str:
        return repr(self.ds)

    def train_steps(self, generator: torch.Generator, device, start: int = 0) -> Iterator[Step]:
        """This worker's steps of one epoch from step ``start`` on; the partition and the order of its
        parts are drawn from ``generator`` alone, so every worker (and a resumed run) draws the same."""
        from revgnn.data.random_parts import Partition, random_partition

        ds, k, per_worker = self.ds, self.parts_per_step, self.parts_per_step // self.world_size
        num_parts = self.tc.train_parts
        part = random_partition(ds.num_nodes, num_parts, generator, self.partition)
        order = self.part_order(generator)
        partition = Partition(ds.edge_index, part, num_parts)
        counts = torch.zeros(num_parts, dtype=torch.long).index_add_(0, part, self.entries).tolist()
        for s in range(start, num_parts // k):
            parts = order[s * k : (s + 1) * k]
            total = sum(counts[p] for p in parts)
            if total == 0:  # no labelled node in the whole step (every worker skips it)
                continue
            mine = parts[self.rank * per_worker : (self.rank + 1) * per_worker]
            yield Step(s, (self._batch(partition[p], device) for p in mine if counts[p] > 0), total)

    def part_order(self, generator: torch.Generator) -> list:
        """The order an epoch visits its parts in: shuffled (``trainer.shuffle_parts``, drawn from
        ``generator`` after the partition) or ``0, ..., K-1``."""
        num_parts = self.tc.train_parts
        if self.shuffle_parts:
            return torch.randperm(num_parts, generator=generator).tolist()
        return list(range(num_parts))

    def _batch(self, sub, device) -> Batch:
        from revgnn.engine.inference import as_edge_index

        ds = self.ds
        mask = self.train_mask[sub.node_idx]
        x = sub.node_rows(ds.x).to(device)
        edge_index = as_edge_index(sub.edge_index.to(device), sub.num_nodes)
        edge_attr = None if ds.edge_attr is None else sub.edge_rows(ds.edge_attr).to(device)
        y = ds.y[sub.node_idx[mask]].to(device)
        return Batch((x, edge_index, edge_attr), mask.to(device), y, int(self.entries[sub.node_idx].sum()))

    def fix_eval_views(self, generator: torch.Generator) -> None:
        """Draws the ``trainer.eval_views`` x ``trainer.eval_parts`` evaluation views now; every later
        :meth:`evaluate` scores on these same partitions (and ignores its generator)."""
        from revgnn.engine.inference import draw_views

        self.eval_views = draw_views(
            self.ds, self.tc.eval_views, self.tc.eval_parts, generator, self.partition
        )

    def evaluate(
        self, model: nn.Module, generator: torch.Generator, device, autocast=None
    ) -> Dict[str, float]:
        """Multi-view scores, on the fixed views if :meth:`fix_eval_views` drew them, else on fresh
        ones from ``generator``; each worker runs its share of the forwards and the logits summed
        over the workers are scored everywhere."""
        return self.scorer(self.node_logits(model, generator, device, autocast))

    def node_logits(self, model: nn.Module, generator: torch.Generator, device, autocast=None) -> Tensor:
        """The ``[N, C]`` logits :meth:`evaluate` scores (averaged over the views, summed over the
        workers), row ``i`` for node ``i`` of the data set as trained (map a reordered one back with
        :func:`revgnn.data.ordering.in_original_order`)."""
        from revgnn.engine.inference import predict_views

        if self.eval_views is not None:
            shard = (self.rank, self.world_size)
            logits = predict_views(model, self.ds, self.eval_views, device, autocast, shard)
        else:
            logits = self._predict(model, self.tc.eval_views, self.tc.eval_parts, generator, device, autocast)
        return self._summed(logits)

    def final_test(
        self, model: nn.Module, generator: torch.Generator, device, autocast=None
    ) -> Dict[str, float]:
        """Scores ``model`` on ``trainer.test_views`` fresh views of ``trainer.test_parts`` parts from
        ``generator``, logits averaged (the official ``test.py``); forwards dealt out as in
        :meth:`evaluate`."""
        logits = self._predict(model, self.tc.test_views, self.tc.test_parts, generator, device, autocast)
        return self.scorer(self._summed(logits))

    def _predict(self, model, views: int, parts: int, generator, device, autocast) -> Tensor:
        """This worker's share of the logits summed over ``views`` fresh views of ``parts`` parts."""
        from revgnn.engine.inference import predict

        shard = (self.rank, self.world_size)
        return predict(model, self.ds, views, parts, generator, device, autocast, shard, self.partition)

    def _summed(self, logits: Tensor) -> Tensor:
        """This worker's share of the logits summed over the workers."""
        return self.workers.all_reduce(logits, "all_reduce of the evaluation's logits")


class GraphTask:
    """Graph-level training on shuffled mini-batches of graphs, scored by OGB's graph evaluator.

    Args:
        ds (GraphDataset): The graphs.
        trainer_cfg: ``trainer`` config, checked by :meth:`check_trainer` (default: none).
        workers (Workers): The workers; graph-level data trains in one (default: :data:`ONE_WORKER`).
    """

    level = "graph"

    def __init__(self, ds, trainer_cfg=None, workers: Workers = ONE_WORKER):
        from revgnn.engine.metrics import METRICS

        self.ds = ds
        self.evaluator = None  # a metric of revgnn.engine.metrics, by name
        if ds.evaluator in METRICS:
            self.metric = ds.evaluator
        else:
            from ogb.graphproppred import Evaluator

            self.evaluator = Evaluator(ds.evaluator)
            self.metric = self.evaluator.eval_metric
        if self.evaluator is not None and self.evaluator.num_tasks != ds.num_classes:
            raise ValueError(
                f"{ds.name}: {ds.num_classes} tasks, but evaluator {ds.evaluator!r} expects "
                f"{self.evaluator.num_tasks}"
            )
        if trainer_cfg is not None:
            self.check_trainer(trainer_cfg, workers.world_size, ds.name)
        self.name, self.shapes = ds.name, shapes(ds)

    @staticmethod
    def check_trainer(tc, world_size: int, name: str = "the data set") -> None:
        """Refuses settings that graph-level data (``name``) cannot apply: more than one worker
        (``backend=ddp`` deals out the parts of one graph), ``trainer.parts_per_step`` (a step is one
        batch of graphs) and a final test of more than one view. Raises
        :class:`~revgnn.errors.ConfigError`."""
        from revgnn.errors import ConfigError

        if world_size > 1:
            raise ConfigError(
                f"backend=ddp deals out the parts of a node-level graph; {name} is graph-level: "
                f"train it with backend=local"
            )
        if tc.parts_per_step not in (None, 1):
            raise ConfigError(
                f"trainer.parts_per_step concerns node-level partitions; {name} is graph-level "
                f"and takes one batch of data.batch_size graphs per step"
            )
        check_whole_graph_test(tc, f"{name} is graph-level: it")

    def __repr__(self) -> str:
        return repr(self.ds)

    @staticmethod
    def _inputs(data, device) -> Tuple[Any, ...]:
        edge_attr = data.edge_attr.to(device) if data.edge_attr is not None else None
        return (
            data.x.to(device),
            data.edge_index.to(device),
            edge_attr,
            data.batch.to(device),
            data.num_graphs,
        )

    def train_steps(self, generator: torch.Generator, device, start: int = 0) -> Iterator[Step]:
        for s, data in enumerate(self.ds.loader("train", shuffle=True, generator=generator)):
            if s < start:
                continue
            y = data.y.view(data.num_graphs, -1).to(device)
            count = int(labelled_entries(y).sum())
            if count == 0:
                continue
            yield Step(s, iter([Batch(self._inputs(data, device), None, y, count)]), count)

    def loss(self, logits: Tensor, batch: Batch, total: int) -> Tensor:
        return task_loss(logits, batch.y, self.ds.task, "sum") / total

    @torch.no_grad()
    def predict(self, model: nn.Module, split: str, device, autocast=None) -> Tensor:
        """``[G, T]`` float32 logits of ``split``'s graphs, in split order, on the CPU."""
        was_training = model.training
        model.eval()
        out = []
        for data in self.ds.loader(split, shuffle=False):
            with autocast_or_null(autocast):
                out.append(model(*self._inputs(data, device)).float().cpu())
        model.train(was_training)
        return torch.cat(out, dim=0) if out else torch.zeros(0, self.ds.num_classes)

    def evaluate(
        self, model: nn.Module, generator: Optional[torch.Generator], device, autocast=None
    ) -> Dict[str, float]:
        from revgnn.engine.divergence import check_predictions

        logits = {split: self.predict(model, split, device, autocast) for split in ("train", "valid", "test")}
        check_predictions(logits)
        scores = {}
        for split, out in logits.items():
            y = self.ds.labels(split)
            if self.evaluator is None:
                from revgnn.engine.metrics import score

                scores[split] = score(self.metric, y, out, self.ds.task)
                continue
            pred = out.argmax(-1, keepdim=True) if self.ds.task == "multiclass" else out
            scores[split] = float(self.evaluator.eval({"y_true": y, "y_pred": pred})[self.metric])
        return scores

    def fix_eval_views(self, generator: torch.Generator) -> None:
        """Whole graphs are scored deterministically: there is no random view to fix."""

    def final_test(
        self, model: nn.Module, generator: Optional[torch.Generator], device, autocast=None
    ) -> Dict[str, float]:
        """The final test of a checkpoint: :meth:`evaluate` (whole graphs, deterministic)."""
        return self.evaluate(model, generator, device, autocast)


def make_task(ds, trainer_cfg, workers: Workers = ONE_WORKER, name: str = "graph") -> Task:
    """:class:`NodeTask` for a ``NodeDataset``, :class:`GraphTask` for a ``GraphDataset``; features
    that are not finite are a :class:`~revgnn.errors.ConfigError`
    (:func:`revgnn.data.checks.check_finite_inputs`). Anything else a loader returns (a PyG ``Data``,
    a list of them, a PyG data set) is converted by :func:`revgnn.data.pyg_data.from_pyg` under
    ``name``, with its conventions (task and metric from ``y``, split from masks or ``split_idx``)."""
    from revgnn.data.checks import check_finite_inputs
    from revgnn.data.graph_dataset import GraphDataset
    from revgnn.data.node_dataset import NodeDataset

    if not isinstance(ds, (NodeDataset, GraphDataset)):
        from revgnn.data.pyg_data import from_pyg

        ds = from_pyg(ds, name)
    check_finite_inputs(ds)  # NaN inputs: refused here, not read as a divergence
    if isinstance(ds, NodeDataset):
        return NodeTask(ds, trainer_cfg, workers)
    if isinstance(ds, GraphDataset):
        return GraphTask(ds, trainer_cfg, workers)
    raise TypeError(
        f"data._target_ must build a revgnn.data.NodeDataset or revgnn.data.graph_dataset.GraphDataset, "
        f"got {type(ds).__name__}"
    )


def model_shapes(
    in_channels: int, out_channels: int, edge_channels: Optional[int] = None, species_channels: int = 0
) -> Dict[str, Any]:
    """The model's data-dependent arguments (:data:`revgnn.models.registry.SHAPE_ARGUMENTS`)."""
    return dict(
        in_channels=in_channels,
        out_channels=out_channels,
        edge_channels=edge_channels,
        species_channels=species_channels,
    )


def shapes(ds) -> Dict[str, Any]:
    """The model's data-dependent arguments of the data set ``ds`` (:func:`model_shapes`)."""
    return model_shapes(ds.in_channels, ds.num_classes, ds.edge_channels, ds.species_channels)


#: The task class of each data level (:func:`data_level`).
TASKS = {"node": NodeTask, "graph": GraphTask}


def data_level(loader: Any) -> Optional[str]:
    """``"node"`` or ``"graph"`` where the data loader ``loader`` declares it by its return annotation
    (:class:`~revgnn.data.node_dataset.NodeDataset`, :class:`~revgnn.data.graph_dataset.GraphDataset`),
    so that the checks of the level's task run before the data loads; ``None`` where only the loaded
    data tells (a loader returning a PyG object, or either format)."""
    import inspect

    from revgnn.data.graph_dataset import GraphDataset
    from revgnn.data.node_dataset import NodeDataset

    try:
        returned = inspect.signature(loader).return_annotation
    except (TypeError, ValueError):
        return None
    if isinstance(returned, str):  # postponed: the name, where the loader's module imports it lazily
        try:
            returned = eval(returned, getattr(loader, "__globals__", {}))
        except Exception:  # imported under TYPE_CHECKING only (loaders import torch when called)
            by_name = {"NodeDataset": "node", "GraphDataset": "graph"}
            return by_name.get(returned.strip("'\" ").rpartition(".")[2])
    if isinstance(returned, type) and issubclass(returned, NodeDataset):
        return "node"
    if isinstance(returned, type) and issubclass(returned, GraphDataset):
        return "graph"
    return None
