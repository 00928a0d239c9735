r"""Communication for SAR on :mod:`torch.distributed` (gloo on CPU, NCCL on GPU).

Workers are started by ``torchrun`` (or, in tests, spawned on 127.0.0.1).
Every transfer is a point-to-point ``isend``/``irecv`` between two workers
whose sizes both sides already know from the setup exchange, so nothing is
ever padded or gathered. Waits are bounded: a peer that died or never
arrives turns into a :class:`SARCommError` naming the peer and the
operation instead of a hang.

A failed collective (all-reduce, all-gather, broadcast) does not say which
peer failed it: gloo reports a timeout or a closed connection, no rank. So
every worker learns where its peers run when it joins (host, process id,
start time: :func:`init_distributed`), and a failed operation looks at the
peers on its own host (:func:`peer_states`): one that has ended is named as
such, and one that is *stopped* (SIGSTOP, a debugger) is named and ended
with SIGKILL. A stopped process acts on no other signal, so without this
``torchrun`` would send it SIGTERM after the first worker's error and wait
its shutdown timeout (30 s) before killing it; this way the job ends when
the first survivor's wait ends, within ``backend.timeout_s``.
"""

from __future__ import annotations

import datetime
import os
import re
import signal
import socket
import time
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = [
    "SARCommError",
    "init_distributed",
    "Transfer",
    "post_transfer",
    "all_reduce_sum",
    "all_gather_object_checked",
    "barrier",
    "peer_states",
    "broadcast_parameters",
    "all_reduce_gradients",
    "AllReduceSum",
]

DEFAULT_TIMEOUT_S = 300.0
# The timeout the process group was created with by init_distributed (None if
# it was created elsewhere): Transfer waits without their own timeout use it.
_pg_timeout_s: Optional[float] = None
# Every worker's (host, pid, start time), by rank, exchanged by init_distributed.
_workers: Optional[List[Tuple[str, int, Optional[int]]]] = None


class SARCommError(RuntimeError):
    """A collective or point-to-point transfer failed or timed out: a peer
    died, hung, or never joined."""


def _timeout(seconds: Optional[float]) -> datetime.timedelta:
    return datetime.timedelta(seconds=DEFAULT_TIMEOUT_S if seconds is None else float(seconds))


def _cause(e: BaseException) -> str:
    # torch appends C++ stack traces after the first line, and gloo prefixes
    # its source location.
    lines = str(e).strip().splitlines()
    first = re.sub(r"^\[[^\]]*\.(cc|cpp|h):\d+\] ", "", lines[0] if lines else "")
    return f"{type(e).__name__}: {first}"


def init_distributed(
    backend: Optional[str] = None,
    timeout_s: Optional[float] = None,
    init_method: Optional[str] = None,
    rank: Optional[int] = None,
    world_size: Optional[int] = None,
    device: Optional[torch.device] = None,
) -> None:
    r"""Joins the process group (idempotent).

    Without arguments it reads the ``torchrun`` environment (``RANK``,
    ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``).

    Args:
        backend (str, optional): ``"gloo"`` or ``"nccl"``; by default the one
            for ``device``: NCCL for CUDA, gloo otherwise. (default: ``None``)
        timeout_s (float, optional): bound on every wait (rendezvous,
            collectives, transfers). (default: ``300``)
        init_method (str, optional): e.g. ``"tcp://127.0.0.1:29500"``.
            (default: ``None`` = ``env://``)
        rank (int, optional): this worker's rank. (default: ``None``)
        world_size (int, optional): number of workers. (default: ``None``)
        device (torch.device, optional): the device the tensors to communicate live on; a CPU run
            on a machine with a GPU gets gloo. (default: the CPU)
    """
    global _pg_timeout_s
    if dist.is_initialized():
        return
    if backend is None:
        backend = "nccl" if torch.device(device or "cpu").type == "cuda" else "gloo"
    if init_method is None and "MASTER_ADDR" not in os.environ:
        raise SARCommError(
            "No rendezvous: launch with torchrun (which sets MASTER_ADDR, "
            "MASTER_PORT, RANK, WORLD_SIZE) or pass init_method"
        )
    kwargs = {}
    if rank is not None:
        kwargs.update(rank=rank, world_size=world_size)
    timeout = _timeout(timeout_s)
    try:
        dist.init_process_group(backend, init_method=init_method, timeout=timeout, **kwargs)
    except Exception as e:  # store timeout, refused connection, ...
        # Name this worker as torchrun does when the caller did not.
        if rank is None:
            rank = os.environ.get("RANK", "?")
        if world_size is None:
            world_size = os.environ.get("WORLD_SIZE", "?")
        where = init_method or (f"env://{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT', '?')}")
        raise SARCommError(
            f"[rank {rank}] Could not join the process group of "
            f"{world_size} workers at {where} within "
            f"{timeout.total_seconds():g} s (backend={backend}): a peer "
            f"never arrived or the rendezvous address is wrong. Check that "
            f"every worker was started with the same address and world size "
            f"and read the logs of those that did not join. Cause: "
            f"{_cause(e)}"
        ) from e
    _pg_timeout_s = timeout.total_seconds()
    _exchange_workers()


def _proc_stat(pid: int) -> Optional[Tuple[str, int]]:
    """``(state, start time in clock ticks)`` of process ``pid`` from ``/proc``, or :obj:`None` if
    there is no such process (or no ``/proc``)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[19])


def _exchange_workers() -> None:
    """Every worker's host, process id and start time (which tells a reused process id apart)."""
    global _workers
    pid = os.getpid()
    stat = _proc_stat(pid)
    me = (socket.gethostname(), pid, stat[1] if stat else None)
    out: List = [None] * dist.get_world_size()
    try:
        dist.all_gather_object(out, me)
    except Exception as e:
        raise _wrap(e, "exchange of the workers' process ids after joining") from e
    _workers = [tuple(w) for w in out]


def peer_states() -> Dict[int, str]:
    """What became of the other workers on this host, by rank: ``"ended"``
    (the process is gone or a zombie) or ``"stopped"`` (SIGSTOP, a debugger). A stopped peer is
    ended with SIGKILL, since it cannot act on any other signal and the job is over once one of its
    operations failed (see the module docstring). Peers on other hosts, and peers still running,
    are left out."""
    if _workers is None or not dist.is_initialized():
        return {}
    me = dist.get_rank()
    host = _workers[me][0]
    states = {}
    for rank, (peer_host, pid, start) in enumerate(_workers):
        if rank == me or peer_host != host:
            continue
        stat = _proc_stat(pid)
        if stat is None or stat[1] != start or stat[0] in ("Z", "X"):
            states[rank] = "ended"
        elif stat[0] in ("T", "t"):
            try:
                os.kill(pid, signal.SIGKILL)
                states[rank] = "stopped"
            except OSError:  # ended meanwhile
                states[rank] = "ended"
    return states


def _describe_peers(states: Dict[int, str]) -> str:
    """The sentence a failed operation's error says about its peers' :func:`peer_states`."""
    parts = []
    for rank, state in sorted(states.items()):
        pid = _workers[rank][1]
        if state == "stopped":
            parts.append(
                f"rank {rank} (pid {pid}) is stopped (SIGSTOP or a debugger): it could take part in "
                f"nothing, and this worker ended it with SIGKILL so that the job ends now"
            )
        else:
            parts.append(f"rank {rank} (pid {pid}) has ended: check rank {rank}'s log for its first error")
    return "; ".join(parts)


def _wrap(e: Exception, what: str) -> SARCommError:
    """The error of a failed collective ``what``, naming the peers on this host that ended or stopped."""
    me = dist.get_rank() if dist.is_initialized() else "?"
    states = peer_states()
    if states:
        why = f"{_describe_peers(states)}."
    else:
        remote = []
        if _workers is not None and dist.is_initialized():
            remote = [r for r, w in enumerate(_workers) if w[0] != _workers[dist.get_rank()][0]]
        if _workers is None:  # a process group that init_distributed did not create
            who = "a peer worker died, hung past the timeout,"
        elif remote:
            who = (
                f"every other worker on this host is still running, so one of ranks "
                f"{', '.join(map(str, remote))} (on other hosts) died or hung, or a worker is slower "
                f"than the timeout,"
            )
        else:
            who = "every other worker is still running: one is hung or slower than the timeout,"
        why = (
            f"{who} failed in another operation, or runs a different model/partitioning; check the "
            f"other workers' logs for the first error; if one is merely slow, raise backend.timeout_s."
        )
    return SARCommError(f"[rank {me}] {what} failed: {why} Cause: {_cause(e)}")


def _peer_error(
    e: BaseException, what: str, label: str, peer: int, timeout_s: Optional[float]
) -> SARCommError:
    """The error for one failed point-to-point work ``label`` ("send to rank
    1") of operation ``what``, naming the peer and what to do."""
    me = dist.get_rank() if dist.is_initialized() else "?"
    cause = _cause(e)
    if isinstance(e, TimeoutError) or "timed out" in cause.lower():
        bound = "the process-group timeout" if timeout_s is None else f"{timeout_s:g} s"
        # gloo moves a message only once the receiver has posted the matching
        # receive, so a send also waits for the peer (measured: a send to a
        # SIGSTOPped peer times out; it completes only if the peer had posted
        # its receive before it stopped).
        why = (
            f"rank {peer} never posted the matching receive"
            if label.startswith("send")
            else f"the data from rank {peer} never arrived"
        )
        msg = (
            f"{label} timed out after {bound}: {why}. Rank {peer} is "
            f"hung or stopped, slower than the timeout, or runs a "
            f"different model/partitioning: check rank {peer}'s log; if it "
            f"is merely slow, raise backend.timeout_s."
        )
    elif any(s in cause.lower() for s in ("closed", "reset", "broken pipe")):
        msg = (
            f"{label} failed: rank {peer} closed the connection (it "
            f"exited, crashed, or gave up after an error of its own); "
            f"check rank {peer}'s log for the first error."
        )
    else:
        msg = f"{label} failed; check rank {peer}'s log."
    # All peers, not only this one: a worker that gave up after a dead peer closes its connections
    # too, so the first connection to close may be a bystander's; the peer that ended first is
    # among those that have ended by now.
    states = peer_states()
    if states:
        msg += f" On this host {_describe_peers(states)}."
    return SARCommError(f"[rank {me}] {what}: {msg} Cause: {cause}")


class Transfer:
    """One posted exchange: send ``send`` to one peer and receive ``recv``
    from another. :meth:`wait` returns the received tensor.

    Every work carries its direction and peer, and an error names the one
    that actually failed or timed out."""

    def __init__(
        self,
        works: List[Tuple[object, str, int]],
        recv: Optional[Tensor],
        send_buf,
        what: str,
        timeout_s: Optional[float],
    ):
        self._works = works  # (work, "send to rank 1", 1)
        self._recv = recv
        self._send_buf = send_buf  # keep the send buffer alive until done
        self.what = what
        self.timeout_s = timeout_s

    def wait(self) -> Optional[Tensor]:
        # One deadline for the whole exchange. The works are waited in turn
        # and the first failure is the one reported: after a timeout gloo
        # closes every connection of this worker ("Application timeout
        # caused pair closure"), so later works would only fail with that.
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        for work, label, peer in self._works:
            try:
                if deadline is None:
                    work.wait()  # the process-group timeout
                else:
                    # Work.wait(0) means "no timeout": keep at least 1 ms.
                    left = max(deadline - time.monotonic(), 1e-3)
                    if not work.wait(datetime.timedelta(seconds=left)):
                        raise TimeoutError("timed out")
            except Exception as e:
                raise _peer_error(e, self.what, label, peer, self.timeout_s) from e
        self._works, self._send_buf = [], None
        return self._recv


def post_transfer(
    send: Optional[Tensor],
    dst: int,
    recv: Optional[Tensor],
    src: int,
    tag: int,
    what: str,
    timeout_s: Optional[float] = None,
) -> Transfer:
    """Posts a non-blocking send of ``send`` to ``dst`` and receive into
    ``recv`` from ``src``; empty or ``None`` tensors are skipped (both sides
    know the sizes, so they skip symmetrically).

    Args:
        what (str): the operation, e.g. ``"SAR max forward, ring step 1"``;
            errors read ``"[rank 0] <what>: send to rank 1 timed out ..."``.
        timeout_s (float, optional): bound on :meth:`Transfer.wait`.
            (default: ``None`` = the process-group timeout)
    """
    if timeout_s is None:
        timeout_s = _pg_timeout_s
    works = []
    label, peer = f"receive from rank {src}", src
    try:
        if recv is not None and recv.numel() > 0:
            works.append((dist.irecv(recv, src=src, tag=tag), label, peer))
        if send is not None and send.numel() > 0:
            send = send.contiguous()
            label, peer = f"send to rank {dst}", dst
            works.append((dist.isend(send, dst=dst, tag=tag), label, peer))
    except Exception as e:  # e.g. the connection is already closed
        raise _peer_error(e, what, label, peer, timeout_s) from e
    return Transfer(works, recv, send, what, timeout_s)


def all_reduce_sum(t: Tensor, what: str = "all_reduce") -> Tensor:
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
        return all_reduce_sum(x.clone(), "AllReduceSum.forward")

    @staticmethod
    def backward(ctx, g: Tensor) -> Tensor:
        return all_reduce_sum(g.clone(), "AllReduceSum.backward")


def all_gather_object_checked(obj, what: str) -> List:
    """``all_gather_object`` with errors turned into :class:`SARCommError`."""
    out: List = [None] * dist.get_world_size()
    try:
        dist.all_gather_object(out, obj)
    except Exception as e:
        raise _wrap(e, what) from e
    return out


def barrier(what: str = "barrier") -> None:
    """``dist.barrier`` with errors turned into :class:`SARCommError`."""
    try:
        dist.barrier()
    except Exception as e:
        raise _wrap(e, what) from e


def broadcast_parameters(module: torch.nn.Module, src: int = 0) -> None:
    """Copies parameters and buffers of rank ``src`` to every worker."""
    try:
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t.data, src=src)
    except Exception as e:
        raise _wrap(e, "broadcast_parameters") from e


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
        all_reduce_sum(flat, "all_reduce_gradients")
        i = 0
        for g in gs:
            n = g.numel()
            g.copy_(flat[i : i + n].view_as(g))
            i += n
