r"""Sequential aggregation and rematerialisation (SAR, Mostafa 2021) for PyG.

Worker :math:`p` owns nodes :math:`\mathcal{V}_p` and their incoming edges,
split into shards :math:`\mathcal{E}_{q \to p}` by the owner :math:`q` of the
source (see :mod:`revgnn.distributed.partition`). A message-passing layer

.. math::
    \mathbf{h}_i = \bigoplus_{j \in \mathcal{N}(i)}
    \phi(\mathbf{x}_j, \mathbf{x}_i, \mathbf{e}_{ji})

is evaluated as a ring over the :math:`P` shards: at step :math:`k` worker
:math:`p` receives the rows of :math:`q = (p - k) \bmod P` that its shard
needs (prefetching step :math:`k+1` meanwhile, so at most two remote blocks
are alive), computes that shard's messages and folds them into a running
per-node state, then frees the block. Nothing edge-sized is kept for
backward: only the local inputs and per-node statistics. The backward pass
runs the ring again, *re-fetches* each remote block, recomputes that shard's
messages with autograd enabled, and sends the gradient of the fetched rows
back to their owner, who adds it to its own input gradient.

Aggregations :math:`\bigoplus` and their per-node state:

* ``sum`` / ``mean``: :math:`\mathbf{h}_i = \sum_j \phi_{ji}` (divided by
  :math:`\max(d_i, 1)` for mean). If :math:`\phi_{ji} = w_{ji}\mathbf{x}_j`
  is linear (``EdgeOp.linear``) the backward needs no re-fetch:
  :math:`\partial L/\partial \mathbf{x}_j = \sum_i w_{ji}\,
  \partial L / \partial \mathbf{h}_i` is computed where the edges live and
  sent to the owner of :math:`j`.
* ``max``: running maximum :math:`m_i` and tie count :math:`c_i`, merged
  across shards as :math:`(m, c) \oplus (m', c') = (m, c)` if :math:`m > m'`,
  :math:`(m', c')` if :math:`m' > m`, :math:`(m, c + c')` if equal. Nodes
  without edges give 0. The gradient is split evenly over ties exactly as
  ``torch.scatter_reduce(reduce='amax', include_self=False)`` (what PyG's
  max aggregation uses on CPU) does, including its quirk that a maximum of
  exactly 0 also counts the zero initial value:
  :math:`\partial L/\partial \phi_{ji} = [\phi_{ji} = h_i]\,
  g_i / (c_i + [h_i = 0])`.
* ``softmax`` (GENConv softmax aggregation, GAT attention): with scores
  :math:`s_{ji}` and values :math:`\mathbf{v}_{ji}`, an *online softmax*
  keeps :math:`M_i = \max_j s_{ji}`, :math:`Z_i = \sum_j e^{s_{ji} - M_i}`
  and :math:`\mathbf{U}_i = \sum_j e^{s_{ji}-M_i}\mathbf{v}_{ji}`, rescaling
  by :math:`e^{M_i^{old} - M_i^{new}}` when a shard raises the maximum;
  :math:`\mathbf{h}_i = \mathbf{U}_i / (Z_i + 10^{-16})` (PyG's epsilon).
  Backward recomputes :math:`a_{ji} = e^{s_{ji}-M_i}/(Z_i + 10^{-16})` per
  shard and uses :math:`\partial L/\partial \mathbf{v}_{ji} = a_{ji}
  \mathbf{g}_i`, :math:`\partial L/\partial s_{ji} = a_{ji}\,\langle
  \mathbf{g}_i, \mathbf{v}_{ji} - \mathbf{h}_i\rangle` (inner product over
  the value dims that share one score). No :math:`E \times` heads tensor is
  stored.

Every worker must run the same model so that all of them enter the same
sequence of rings (forward, backward, and the re-forwards of reversible
blocks) in the same order; transfers are tagged by a per-graph call counter.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from .comm import all_gather_object_checked, post_transfer
from .part_files import PartitionMismatchError

__all__ = ["SARGraph", "EdgeOp", "sequential_aggregate", "SOFTMAX_EPS"]

SOFTMAX_EPS = 1e-16  # PyG's torch_geometric.utils.softmax adds this
_KINDS = ("sum", "mean", "max", "softmax")


def _comm_device() -> torch.device:
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class _Counter:
    def __init__(self):
        self.value = 0

    def next(self) -> int:
        self.value += 1
        return self.value


class SARGraph:
    r"""One worker's share of a partitioned graph plus its communication
    plan; pass it where a PyG conv expects ``edge_index`` (after
    :func:`~revgnn.distributed.convs.convert_to_sar`).

    Construction is collective: every worker checks that all of them loaded
    the same partitioning with the right world size, then one setup exchange
    tells each worker which of its rows every peer needs.

    Args:
        part (dict): this worker's part from
            :func:`~revgnn.distributed.partition.build_partitions` or
            :func:`~revgnn.distributed.part_files.load_partition`.
        timeout_s (float, optional): bound on every transfer wait.
            (default: ``None`` = the process-group timeout)

    Attributes:
        rank, world_size, num_nodes (global), global_num_edges, num_local, offsets,
        node_ids (original ids of local nodes), edge_ids (original ids of the
        local edges), src / dst (local edge
        endpoints: ``src`` indexes the fetched block of the edge's shard,
        ``dst`` the local nodes), shard_ptr (edges of shard ``q`` are
        ``shard_ptr[q]:shard_ptr[q+1]``), in_degree, edge_attr, node_data.
    """

    def __init__(self, part: dict, timeout_s: Optional[float] = None):
        P = int(part["num_parts"])
        if dist.is_initialized():
            rank, world = dist.get_rank(), dist.get_world_size()
        else:
            rank, world = 0, 1
        if world != P or rank != int(part["rank"]):
            raise PartitionMismatchError(
                f"part {part['rank']} of {P} loaded by rank {rank} of a "
                f"{world}-worker job; partition with --num-parts {world}"
            )
        if world > 1:
            infos = all_gather_object_checked(
                (part["fingerprint"], int(part["rank"]), P), "SARGraph setup (partition check)"
            )
            fps = {i[0] for i in infos}
            ranks = [i[1] for i in infos]
            if len(fps) != 1 or ranks != list(range(world)):
                raise PartitionMismatchError(
                    "workers loaded parts of different partitionings or the "
                    f"same part twice: (fingerprint, part, parts) per rank = "
                    f"{infos}"
                )
        self.rank, self.world_size = rank, world
        self.timeout_s = timeout_s
        self.num_nodes = int(part["num_nodes"])
        self.offsets = part["offsets"].long()
        lo, hi = int(self.offsets[rank]), int(self.offsets[rank + 1])
        self.num_local = hi - lo
        self.node_ids = part["node_ids"]
        self.edge_ids = part["edge_ids"]
        self.global_num_edges = int(part["num_edges"])
        self.edge_attr = part.get("edge_attr")
        self.node_data = part.get("node_data", {})
        self.shard_ptr = [int(v) for v in part["shard_ptr"]]
        self.dst = part["dst"].long()
        src_global = part["src"].long()

        # Compact each remote shard's sources into the block of rows it needs.
        src = torch.empty_like(src_global)
        needed: List[Tensor] = []
        for q in range(P):
            a, b = self.shard_ptr[q], self.shard_ptr[q + 1]
            local_in_q = src_global[a:b] - int(self.offsets[q])
            if q == rank:
                src[a:b] = local_in_q
                needed.append(local_in_q.new_zeros(0))
            else:
                uniq, inv = torch.unique(local_in_q, return_inverse=True)
                src[a:b] = inv
                needed.append(uniq)
        self.src = src
        self.num_needed = [int(n.numel()) for n in needed]
        self.in_degree = torch.bincount(self.dst, minlength=self.num_local)
        self._counter = _Counter()

        # Setup exchange: tell every owner which of its rows we need.
        self.send_idx: List[Tensor] = [self.dst.new_zeros(0)] * P
        if P > 1:
            counts = all_gather_object_checked(self.num_needed, "SARGraph setup (counts)")
            tag = self.next_tag()
            dev = _comm_device()  # NCCL moves CUDA tensors only
            for k in range(1, P):
                to, frm = (rank - k) % P, (rank + k) % P
                buf = torch.empty(counts[frm][rank], dtype=torch.long, device=dev)
                tr = post_transfer(
                    needed[to].to(dev),
                    to,
                    buf,
                    frm,
                    tag,
                    f"SARGraph setup (row requests, step {k})",
                    timeout_s,
                )
                self.send_idx[frm] = tr.wait().cpu()
        self._self_loop_view: Optional["SARGraph"] = None
        self._loop_keep: Optional[Tensor] = None

    # ------------------------------------------------------------------ utils
    def to(self, device) -> "SARGraph":
        """Moves the index tensors, edge attributes and node data to
        ``device`` (in place; with NCCL the features must live on the
        worker's GPU)."""
        for name in ("src", "dst", "in_degree", "edge_attr", "_loop_keep"):
            t = getattr(self, name, None)
            if t is not None:
                setattr(self, name, t.to(device))
        self.send_idx = [t.to(device) for t in self.send_idx]
        self.node_data = {k: v.to(device) for k, v in self.node_data.items()}
        if self._self_loop_view is not None and self._self_loop_view is not self:
            self._self_loop_view.to(device)
        return self

    def next_tag(self) -> int:
        """The message tag of this graph's next exchange (a multiple of 4: the exchange may use ``tag``
        to ``tag + 3``, e.g. ``tag + 1`` for the gradients :meth:`return_grads` sends back). Every worker
        calls it for the same exchanges in the same order, so the tags of matching sends and receives
        agree, and exchanges in flight at once do not take each other's messages."""
        return (self._counter.next() % (1 << 24)) * 4

    @property
    def num_edges(self) -> int:
        return int(self.dst.numel())

    def shard(self, q: int) -> Tuple[int, int]:
        """Edge range of the shard whose sources live on worker ``q``."""
        return self.shard_ptr[q], self.shard_ptr[q + 1]

    def sorted_shard(self, q: int) -> Tuple[Tensor, Tensor, Optional[Tensor], int]:
        """Shard ``q``'s edges by destination for a fused kernel: ``(src, dst, perm, rows)``, with
        ``perm`` the stable sorting permutation of the shard's edges (:obj:`None` where they are sorted
        already, as :mod:`~revgnn.distributed.partition` writes them) and ``rows`` the number of rows
        its sources index (the local nodes for the own shard, else the rows fetched from ``q``); a
        source outside them is a :class:`ValueError`, before any kernel reads with it."""
        a, b = self.shard(q)
        src, dst = self.src[a:b], self.dst[a:b]
        perm = None
        if dst.numel() > 1 and bool((dst[1:] < dst[:-1]).any()):
            perm = torch.sort(dst, stable=True).indices
            src, dst = src[perm], dst[perm]
        rows = self.num_local if q == self.rank else self.num_needed[q]
        if src.numel() and (int(src.min()) < 0 or int(src.max()) >= rows):
            raise ValueError(f"shard {q}: source index outside the {rows} fetched rows")
        return src, dst, perm, rows

    def cached(self, name: str, build: Callable[["SARGraph"], Any]) -> Any:
        """``build(self)`` (a fused kernel's per-shard layouts), kept on this graph under ``name`` and
        built again once :attr:`src` is another tensor (:meth:`to` moves it; a :meth:`with_self_loops`
        view is a graph of its own, with its own entries)."""
        entry = getattr(self, name, None)
        if entry is None or entry[0] is not self.src:
            entry = (self.src, build(self))
            setattr(self, name, entry)
        return entry[1]

    def local_range(self) -> Tuple[int, int]:
        return int(self.offsets[self.rank]), int(self.offsets[self.rank + 1])

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}(rank={self.rank}/"
            f"{self.world_size}, local_nodes={self.num_local}, "
            f"local_edges={self.num_edges})"
        )

    # ------------------------------------------------------------ self loops
    def with_self_loops(self) -> "SARGraph":
        r"""View with every self loop removed and one loop :math:`(i, i)`
        added per local node (PyG's ``remove_self_loops`` +
        ``add_self_loops``, as in ``GATConv``). Shares the communication
        plan (loops are local). Cached."""
        if self._self_loop_view is not None:
            return self._self_loop_view
        r = self.rank
        a, b = self.shard(r)
        local_src, local_dst = self.src[a:b], self.dst[a:b]
        keep = (local_src != local_dst).nonzero().view(-1) + a
        loops = torch.arange(self.num_local, device=self.dst.device)
        view = copy.copy(self)
        view.src = torch.cat([self.src[:a], self.src[keep], loops, self.src[b:]])
        view.dst = torch.cat([self.dst[:a], self.dst[keep], loops, self.dst[b:]])
        grow = keep.numel() + self.num_local - (b - a)
        view.shard_ptr = self.shard_ptr[: r + 1] + [v + grow for v in self.shard_ptr[r + 1 :]]
        view.in_degree = torch.bincount(view.dst, minlength=self.num_local)
        view.edge_ids = None
        view._loop_keep = keep
        view._self_loop_view = view
        self._self_loop_view = view
        return view

    def self_loop_edge_attr(self, edge_attr: Tensor, fill_value="mean") -> Tensor:
        r"""Edge attributes aligned with :meth:`with_self_loops`. ``fill_value``
        is a number, a tensor, ``"mean"``/``"add"``/``"max"``/``"min"``/
        ``"mul"`` (reduced over the node's other incoming edges), as in
        PyG's ``add_self_loops``."""
        from torch_geometric.utils import scatter

        view = self.with_self_loops()
        keep = view._loop_keep
        a, b = self.shard(self.rank)
        # Attributes of all non-loop incoming edges (every shard) per node.
        mask = torch.ones(self.num_edges, dtype=torch.bool, device=self.dst.device)
        mask[a:b] = False
        mask[keep] = True
        n = self.num_local
        if isinstance(fill_value, str):
            loop_attr = scatter(edge_attr[mask], self.dst[mask], 0, n, reduce=fill_value)
        elif isinstance(fill_value, (int, float)):
            loop_attr = edge_attr.new_full((n,) + edge_attr.shape[1:], fill_value)
        elif isinstance(fill_value, Tensor):
            loop_attr = fill_value.to(edge_attr).expand((n,) + edge_attr.shape[1:])
        else:
            raise ValueError(f"unsupported fill_value {fill_value!r}")
        return torch.cat([edge_attr[:a], edge_attr[keep], loop_attr, edge_attr[b:]])

    # --------------------------------------------------------------- the ring
    def ring(self, x: Tensor, what: str):
        r"""Yields ``(q, block)`` for :math:`k = 0, \dots, P-1` with
        :math:`q = (p - k) \bmod P`: the rows of worker :math:`q` needed by
        this worker's shard :math:`q` (``x`` itself for :math:`q = p`).
        Step :math:`k+1` is posted before step :math:`k` is handed out, so at
        most the current and one prefetched block are alive."""
        P, r = self.world_size, self.rank
        if P == 1:
            yield r, x
            return
        if x.size(0) != self.num_local:
            raise ValueError(f"{what}: expected {self.num_local} local rows, got {x.size(0)}")
        x = x.contiguous()
        tag = self.next_tag()

        def post(k: int):
            to, frm = (r + k) % P, (r - k) % P
            idx = self.send_idx[to]
            send = x.index_select(0, idx) if idx.numel() else None
            recv = x.new_empty((self.num_needed[frm],) + x.shape[1:])
            # post_transfer names the peer of each work (send to `to`,
            # receive from `frm`), so the label is only the operation.
            return frm, post_transfer(send, to, recv, frm, tag, f"{what}, ring step {k}", self.timeout_s)

        nxt = post(1)
        yield r, x
        for k in range(1, P):
            q, tr = nxt
            block = tr.wait()
            nxt = post(k + 1) if k + 1 < P else None
            yield q, block
            del block

    def return_grads(self, q: int, grad_block: Optional[Tensor], grad_x: Tensor, tag: int, what: str) -> None:
        r"""Sends the gradient of the rows fetched from ``q`` back to ``q``
        and adds the gradient a peer computed for this worker's rows (the
        peer that received them at the same ring step) into ``grad_x``."""
        P, r = self.world_size, self.rank
        k = (r - q) % P
        frm = (r + k) % P
        idx = self.send_idx[frm]
        recv = grad_x.new_empty((idx.numel(),) + grad_x.shape[1:])
        tr = post_transfer(
            grad_block, q, recv, frm, tag + 1, f"{what}, gradient return of ring step {k}", self.timeout_s
        )
        got = tr.wait()
        if idx.numel():
            grad_x.index_add_(0, idx, got)


class EdgeOp:
    r"""Per-edge message :math:`\phi` plus the aggregation it feeds.

    Subclasses set ``kind`` (``"sum"``, ``"mean"``, ``"max"``,
    ``"softmax"``) and implement :meth:`message`; for ``softmax`` it returns
    ``(score, value)`` with ``value.shape[:score.dim()] == score.shape``,
    otherwise ``(None, value)``. ``linear = True`` promises
    :math:`\phi_{ji} = w_{ji}\mathbf{x}_j` with ``edge`` holding the
    constant weights :math:`w` (or ``None``): the backward then skips the
    re-fetch. ``detach_score = True`` stops the gradient through softmax
    scores (GENConv's ``semi_grad``).
    """

    kind: str = "sum"
    linear: bool = False
    detach_score: bool = False

    def params(self) -> List[Tensor]:
        """Tensors the message depends on that may need gradients."""
        return []

    def message(
        self, x_j: Tensor, x_i: Optional[Tensor], edge: Optional[Tensor], params: Sequence[Tensor]
    ) -> Tuple[Optional[Tensor], Tensor]:
        if not self.linear:
            raise NotImplementedError
        if edge is None:
            return None, x_j
        return None, x_j * edge.view((-1,) + (1,) * (x_j.dim() - 1))


def _expand(index: Tensor, like: Tensor) -> Tensor:
    return index.view((-1,) + (1,) * (like.dim() - 1)).expand_as(like)


def _bcast(t: Tensor, like: Tensor) -> Tensor:
    """Appends singleton dims so a score-shaped tensor broadcasts to values."""
    return t.view(t.shape + (1,) * (like.dim() - t.dim()))


def _shard_inputs(graph: SARGraph, q: int, block: Tensor, x_dst: Optional[Tensor], edge: Optional[Tensor]):
    a, b = graph.shard(q)
    src, dst = graph.src[a:b], graph.dst[a:b]
    x_j = block.index_select(0, src)
    x_i = None if x_dst is None else x_dst.index_select(0, dst)
    e = None if edge is None else edge[a:b]
    return src, dst, x_j, x_i, e


class _SeqAggregate(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        op: EdgeOp,
        graph: SARGraph,
        x_src: Tensor,
        x_dst: Optional[Tensor],
        edge: Optional[Tensor],
        *params: Tensor,
    ) -> Tensor:
        n, kind = graph.num_local, op.kind
        out = m = c = Z = None
        for q, block in graph.ring(x_src, f"SAR {kind} forward"):
            _, dst, x_j, x_i, e = _shard_inputs(graph, q, block, x_dst, edge)
            s, v = op.message(x_j, x_i, e, params)
            del x_j, x_i, e
            if out is None:  # shapes known after the first (local) shard
                out = v.new_zeros((n,) + v.shape[1:])
                if kind == "max":
                    m = v.new_full(out.shape, float("-inf"))
                    c = v.new_zeros(out.shape)
                elif kind == "softmax":
                    m = s.new_full((n,) + s.shape[1:], float("-inf"))
                    Z = s.new_zeros(m.shape)
            if kind in ("sum", "mean"):
                out.index_add_(0, dst, v)
            elif kind == "max":
                ms = v.new_full(out.shape, float("-inf")).scatter_reduce_(0, _expand(dst, v), v, "amax")
                cs = v.new_zeros(out.shape).index_add_(0, dst, (v == ms.index_select(0, dst)).to(v.dtype))
                gt, eq = ms > m, ms == m
                c = torch.where(gt, cs, torch.where(eq, c + cs, c))
                m = torch.where(gt, ms, m)
            else:  # online softmax
                ms = m.clone().scatter_reduce_(0, _expand(dst, s), s, "amax")
                scale = torch.where(m == float("-inf"), torch.zeros_like(m), torch.exp(m - ms))
                w = torch.exp(s - ms.index_select(0, dst))
                Z = Z * scale + torch.zeros_like(Z).index_add_(0, dst, w)
                out = out * _bcast(scale, out) + torch.zeros_like(out).index_add_(0, dst, _bcast(w, v) * v)
                m = ms
            del s, v
        if kind == "mean":
            out = out / _bcast(graph.in_degree.clamp(min=1).to(out.dtype), out)
            saved = ()
        elif kind == "sum":
            saved = ()
        elif kind == "max":
            out = torch.where(c > 0, m, torch.zeros_like(m))
            # torch's amax backward also counts the zero initial value.
            saved = (c + (out == 0).to(c.dtype),)
        else:
            Z = Z + SOFTMAX_EPS
            out = out / _bcast(Z, out)
            saved = (m, Z)
        ctx.op, ctx.graph = op, graph
        ctx.num_params = len(params)
        ctx.src_shape = x_src.shape
        if op.linear and kind in ("sum", "mean"):
            # The fast path needs neither the inputs nor the output.
            x_src = x_dst = out_saved = None
        else:
            out_saved = out
        ctx.save_for_backward(x_src, x_dst, edge, out_saved, *saved, *params)
        return out

    @staticmethod
    def backward(ctx, g: Tensor):
        op, graph = ctx.op, ctx.graph
        x_src, x_dst, edge, out, *rest = ctx.saved_tensors
        params = rest[len(rest) - ctx.num_params :]
        saved = rest[: len(rest) - ctx.num_params]
        kind = op.kind
        need = ctx.needs_input_grad
        g = g.contiguous()
        if kind == "mean":
            g = g / _bcast(graph.in_degree.clamp(min=1).to(g.dtype), g)
        elif kind == "max":
            g = g / saved[0]
        grad_x = g.new_zeros(ctx.src_shape)
        tag = graph.next_tag()
        what = f"SAR {kind} backward"

        if op.linear and kind in ("sum", "mean"):
            # Fast path: d out_i / d x_j = w_ji, so the source gradient is the
            # transposed aggregation of g: no re-fetch of remote rows.
            for k in range(graph.world_size):
                q = (graph.rank - k) % graph.world_size
                a, b = graph.shard(q)
                src, dst = graph.src[a:b], graph.dst[a:b]
                ge = g.index_select(0, dst)
                if edge is not None:
                    ge = ge * _bcast(edge[a:b], ge)
                rows = graph.num_local if q == graph.rank else graph.num_needed[q]
                gb = g.new_zeros((rows,) + ctx.src_shape[1:]).index_add_(0, src, ge)
                if q == graph.rank:
                    grad_x += gb
                else:
                    graph.return_grads(q, gb, grad_x, tag, what)
            return (None, None, grad_x, None, None) + (None,) * len(params)

        grad_dst = torch.zeros_like(x_dst) if x_dst is not None else None
        grad_edge = torch.zeros_like(edge) if edge is not None and need[4] else None
        leaves = [p.detach().requires_grad_(n) for p, n in zip(params, need[5:])]
        grad_params = [torch.zeros_like(p) if n else None for p, n in zip(params, need[5:])]
        x_dst_leaf = x_dst.detach().requires_grad_(need[3]) if x_dst is not None else None

        for q, block in graph.ring(x_src, f"SAR {kind} backward re-fetch"):
            a, b = graph.shard(q)
            src, dst = graph.src[a:b], graph.dst[a:b]
            with torch.enable_grad():
                blk = block.detach().requires_grad_()
                x_j = blk.index_select(0, src)
                x_i = None if x_dst_leaf is None else x_dst_leaf.index_select(0, dst)
                e = None
                if edge is not None:
                    e = edge[a:b].detach().requires_grad_(need[4])
                s, v = op.message(x_j, x_i, e, leaves)
            gd = g.index_select(0, dst)
            outs, gouts = [v], []
            if kind in ("sum", "mean"):
                gouts.append(gd)
            elif kind == "max":
                mask = v.detach() == out.index_select(0, dst)
                gouts.append(mask.to(gd.dtype) * gd)
            else:
                m, Z = saved
                with torch.no_grad():
                    sd, vd = s.detach(), v.detach()
                    alpha = torch.exp(sd - m.index_select(0, dst)) / Z.index_select(0, dst)
                    gouts.append(_bcast(alpha, vd) * gd)
                    if not op.detach_score and s.requires_grad:
                        prod = gd * (vd - out.index_select(0, dst))
                        prod = prod.sum(dim=tuple(range(sd.dim(), vd.dim()))) if vd.dim() > sd.dim() else prod
                        outs.append(s)
                        gouts.append(alpha * prod)
            inputs = [blk]
            if x_dst_leaf is not None and need[3]:
                inputs.append(x_dst_leaf)
            if e is not None and need[4]:
                inputs.append(e)
            inputs += [p for p, n in zip(leaves, need[5:]) if n]
            grads = list(torch.autograd.grad(outs, inputs, gouts, allow_unused=True))
            gb = grads.pop(0)
            if gb is None:
                gb = torch.zeros_like(blk)
            if x_dst_leaf is not None and need[3]:
                gx = grads.pop(0)
                if gx is not None:
                    grad_dst += gx
            if e is not None and need[4]:
                ge = grads.pop(0)
                if ge is not None:
                    grad_edge[a:b] += ge
            for i, n in enumerate(need[5:]):
                if n:
                    gp = grads.pop(0)
                    if gp is not None:
                        grad_params[i] += gp
            del blk, x_j, x_i, e, s, v, outs, gouts
            if q == graph.rank:
                grad_x += gb
            else:
                graph.return_grads(q, gb, grad_x, tag, what)
        return (None, None, grad_x, grad_dst, grad_edge, *grad_params)


def sequential_aggregate(
    op: EdgeOp, graph: SARGraph, x_src: Tensor, x_dst: Optional[Tensor] = None, edge: Optional[Tensor] = None
) -> Tensor:
    r"""Aggregates messages over all of ``graph``'s shards with SAR.

    Args:
        op (EdgeOp): the message :math:`\phi` and aggregation kind.
        graph (SARGraph): this worker's share of the graph.
        x_src (torch.Tensor): ``[num_local, ...]`` source-side node features;
            peers fetch rows of it.
        x_dst (torch.Tensor, optional): ``[num_local, ...]`` target-side
            features passed to :math:`\phi` as ``x_i``. (default: ``None``)
        edge (torch.Tensor, optional): ``[num_local_edges, ...]`` per-edge
            tensor aligned with ``graph`` (edge attributes, or constant
            weights for linear ops). (default: ``None``)

    Returns:
        torch.Tensor: ``[num_local, ...]`` aggregated messages.
    """
    if op.kind not in _KINDS:
        raise ValueError(f"unknown aggregation {op.kind!r}; use one of {_KINDS}")
    if op.linear and (x_dst is not None or op.params() or (edge is not None and edge.requires_grad)):
        raise ValueError("a linear EdgeOp uses no x_dst, no parameters and constant edge weights")
    if edge is not None and edge.size(0) != graph.num_edges:
        raise ValueError(f"edge tensor has {edge.size(0)} rows, the graph has {graph.num_edges} local edges")
    return _SeqAggregate.apply(op, graph, x_src, x_dst, edge, *op.params())
