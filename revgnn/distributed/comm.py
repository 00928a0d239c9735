r"""Communication for SAR on :mod:`torch.distributed` (gloo on CPU, NCCL on GPU).

Workers are started by ``torchrun`` (or, in tests, spawned on 127.0.0.1).
Every transfer is a point-to-point ``isend``/``irecv`` between two workers
whose sizes both sides already know from the setup exchange, so nothing is
ever padded or gathered. Waits are bounded: a peer that died or never
arrives turns into a :class:`SARCommError` naming the peer and the
operation instead of a hang.
"""
from __future__ import annotations

import datetime
import os
from typing import List, Optional, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = [
    'SARCommError', 'init_distributed', 'Transfer', 'post_transfer',
    'all_reduce_sum', 'all_gather_object_checked', 'broadcast_parameters',
    'all_reduce_gradients', 'AllReduceSum'
]

DEFAULT_TIMEOUT_S = 300.0


class SARCommError(RuntimeError):
    """A collective or point-to-point transfer failed or timed out: a peer
    died, hung, or never joined."""


def _timeout(seconds: Optional[float]) -> datetime.timedelta:
    return datetime.timedelta(
        seconds=DEFAULT_TIMEOUT_S if seconds is None else float(seconds))


def init_distributed(backend: Optional[str] = None,
                     timeout_s: Optional[float] = None,
                     init_method: Optional[str] = None,
                     rank: Optional[int] = None,
                     world_size: Optional[int] = None) -> None:
    r"""Joins the process group (idempotent).

    Without arguments it reads the ``torchrun`` environment (``RANK``,
    ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``).

    Args:
        backend (str, optional): ``"gloo"`` or ``"nccl"``; by default NCCL
            if CUDA is available, else gloo. (default: ``None``)
        timeout_s (float, optional): bound on every wait (rendezvous,
            collectives, transfers). (default: ``300``)
        init_method (str, optional): e.g. ``"tcp://127.0.0.1:29500"``.
            (default: ``None`` = ``env://``)
        rank (int, optional): this worker's rank. (default: ``None``)
        world_size (int, optional): number of workers. (default: ``None``)
    """
    if dist.is_initialized():
        return
    if backend is None:
        backend = 'nccl' if torch.cuda.is_available() else 'gloo'
    if init_method is None and 'MASTER_ADDR' not in os.environ:
        raise SARCommError(
            'No rendezvous: launch with torchrun (which sets MASTER_ADDR, '
            'MASTER_PORT, RANK, WORLD_SIZE) or pass init_method')
    kwargs = {}
    if rank is not None:
        kwargs.update(rank=rank, world_size=world_size)
    try:
        dist.init_process_group(backend, init_method=init_method,
                                timeout=_timeout(timeout_s), **kwargs)
    except Exception as e:  # store timeout, refused connection, ...
        raise SARCommError(
            f'Could not join the process group within {timeout_s} s '
            f'(backend={backend}, rank={rank}, world_size={world_size}): '
            f'a peer never arrived or the rendezvous address is wrong. '
            f'Cause: {e}') from e


def _wrap(e: Exception, what: str) -> SARCommError:
    return SARCommError(
        f'[rank {dist.get_rank()}] {what} failed: a peer worker died, hung '
        f'past the timeout, or runs a different model/partitioning. '
        f'Cause: {type(e).__name__}: {e}')


class Transfer:
    """One posted exchange: send ``send`` to one peer and receive ``recv``
    from another. :meth:`wait` returns the received tensor."""

    def __init__(self, works: list, recv: Optional[Tensor], send_buf,
                 what: str, timeout: datetime.timedelta):
        self._works = works
        self._recv = recv
        self._send_buf = send_buf  # keep the send buffer alive until done
        self.what = what
        self._timeout = timeout

    def wait(self) -> Optional[Tensor]:
        try:
            for w in self._works:
                if not w.wait(self._timeout):
                    raise TimeoutError(f'no progress within {self._timeout}')
        except SARCommError:
            raise
        except Exception as e:
            raise _wrap(e, self.what) from e
        self._works, self._send_buf = [], None
        return self._recv


def post_transfer(send: Optional[Tensor], dst: int, recv: Optional[Tensor],
                  src: int, tag: int, what: str,
                  timeout_s: Optional[float] = None) -> Transfer:
    """Posts a non-blocking send of ``send`` to ``dst`` and receive into
    ``recv`` from ``src``; empty or ``None`` tensors are skipped (both sides
    know the sizes, so they skip symmetrically)."""
    works = []
    try:
        if recv is not None and recv.numel() > 0:
            works.append(dist.irecv(recv, src=src, tag=tag))
        if send is not None and send.numel() > 0:
            send = send.contiguous()
            works.append(dist.isend(send, dst=dst, tag=tag))
    except Exception as e:
        raise _wrap(e, what) from e
    return Transfer(works, recv, send, what, _timeout(timeout_s))


def all_reduce_sum(t: Tensor, what: str = 'all_reduce') -> Tensor:
    """In-place sum over workers with errors turned into
    :class:`SARCommError`."""
    try:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    except Exception as e:
        raise _wrap(e, what) from e
    return t


class AllReduceSum(torch.autograd.Function):
    r"""Differentiable :math:`y = \sum_p x_p`: the gradient of every
    :math:`x_p` is :math:`\sum_p \partial L / \partial y_p` (each worker
    computes its own loss term from the shared :math:`y`)."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        return all_reduce_sum(x.clone(), 'AllReduceSum.forward')

    @staticmethod
    def backward(ctx, g: Tensor) -> Tensor:
        return all_reduce_sum(g.clone(), 'AllReduceSum.backward')


def all_gather_object_checked(obj, what: str) -> List:
    """``all_gather_object`` with errors turned into :class:`SARCommError`."""
    out: List = [None] * dist.get_world_size()
    try:
        dist.all_gather_object(out, obj)
    except Exception as e:
        raise _wrap(e, what) from e
    return out


def broadcast_parameters(module: torch.nn.Module, src: int = 0) -> None:
    """Copies parameters and buffers of rank ``src`` to every worker."""
    try:
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t.data, src=src)
    except Exception as e:
        raise _wrap(e, 'broadcast_parameters') from e


def all_reduce_gradients(params: Sequence[torch.nn.Parameter]) -> None:
    r"""Sums gradients over workers, flattened into one buffer per dtype.

    With the loss on each worker normalised by the *global* number of
    labelled nodes, :math:`L = \frac{1}{|\mathcal{L}|}\sum_p
    \sum_{i \in \mathcal{L}_p} \ell_i`, the sum of the per-worker gradients
    is exactly the full-graph gradient.
    """
    # A parameter unused on this worker (e.g. no local edges) still takes
    # part, as zeros, so the flat buffers line up on every worker.
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    by_dtype = {}
    for p in params:
        by_dtype.setdefault((p.grad.dtype, p.grad.device), []).append(p.grad)
    for gs in by_dtype.values():
        flat = torch.cat([g.reshape(-1) for g in gs])
        all_reduce_sum(flat, 'all_reduce_gradients')
        i = 0
        for g in gs:
            n = g.numel()
            g.copy_(flat[i:i + n].view_as(g))
            i += n
