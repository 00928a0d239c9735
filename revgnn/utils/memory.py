"""Memory measures (bytes saved for backward and the largest single allocation, both deterministic;
peak RSS) and returning freed heap memory to the OS."""

from __future__ import annotations

import resource
import sys
from typing import Dict

import torch
from torch import Tensor


class SavedTensorBytes:
    """Counts the bytes autograd saves for backward while the context is active.

    Uses :func:`torch.autograd.graph.saved_tensors_hooks`. Each storage is
    counted once (a tensor saved by many ops, such as an edge embedding shared
    by all layers, occupies memory once), and parameters and views of them are left out (they
    exist whether or not a graph is built). The count is deterministic, so it
    is a good memory measure for tests; peak RSS is what users feel.

    Example:
        >>> import torch
        >>> model, x = torch.nn.Linear(64, 64), torch.randn(100, 64)
        >>> with SavedTensorBytes() as saved:
        ...     loss = model(x).relu().sum()
        >>> saved.bytes  # the linear layer's input and the ReLU's output, 100 x 64 float32 each
        51200
    """

    def __init__(self) -> None:
        self._storages: Dict[int, int] = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, t: Tensor) -> Tensor:
        if isinstance(t, torch.nn.Parameter) or isinstance(t._base, torch.nn.Parameter):
            return t  # a parameter, or a view of one (weight.t() saved by linear)
        try:
            storage = t.untyped_storage()
            self._storages[storage.data_ptr()] = storage.nbytes()
        except RuntimeError:  # wrapper subclasses (e.g. PyG's EdgeIndex) own no storage
            data = t.as_subclass(torch.Tensor) if type(t) is not torch.Tensor else t
            self._storages[id(t)] = data.numel() * data.element_size()
        return t

    @staticmethod
    def _unpack(t: Tensor) -> Tensor:
        return t

    @property
    def bytes(self) -> int:
        return sum(self._storages.values())

    def __enter__(self) -> "SavedTensorBytes":
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)


class LargestAllocation:
    """The largest single CPU allocation (bytes) made while the context is active, and the peak of
    the bytes allocated above the start (``peak``), from the allocator's own reports to
    :mod:`torch.profiler` (``profile_memory=True``). Every tensor torch allocates is seen, including
    the temporaries inside an operator's C++ kernel or PyTorch implementation (which a
    ``TorchDispatchMode`` does not see), so the figure is deterministic for a given computation: a
    test's guard that no :math:`E \times C` tensor exists, where peak RSS would be noisy.

    Example:
        >>> import torch
        >>> x = torch.randn(1000, 16)
        >>> with LargestAllocation() as largest:
        ...     y = x.repeat(4, 1)  # 4000 x 16 float32
        >>> largest.bytes
        256000
    """

    def __init__(self) -> None:
        self.bytes = 0
        self.peak = 0
        self._profile = None

    def __enter__(self) -> "LargestAllocation":
        from torch.profiler import ProfilerActivity, profile

        self._profile = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self._profile.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._profile.__exit__(*exc)
        events = [e for e in self._profile.profiler.kineto_results.events() if e.name() == "[memory]"]
        live = 0
        for event in sorted(events, key=lambda e: e.start_ns()):
            size = event.nbytes()
            self.bytes = max(self.bytes, size)
            live += size
            self.peak = max(self.peak, live)


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far: Linux's ``VmHWM`` (``/proc/self/status``), else
    ``ru_maxrss``.

    ``ru_maxrss`` is not the process's own figure on Linux where it was started by spawning (Python's
    ``multiprocessing`` spawn, ``subprocess``, ``torchrun``'s workers): ``exec`` carries the peak of
    the address space it replaces, the (v)forked parent's, into ``ru_maxrss``, so a small worker of a
    large parent reports the parent's peak. ``VmHWM`` is the high-water mark of this address space
    alone (writing ``5`` to ``/proc/self/clear_refs`` resets it).
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def release_free_memory() -> None:
    """Returns the heap memory the process has freed to the operating system.

    Called after a burst of frees that later allocations will not reuse (e.g. the storage of
    every parameter after :class:`~revgnn.utils.flat.FlatParameters` moved them into one
    buffer): tcmalloc's ``MallocExtension_ReleaseFreeMemory`` when it is the allocator (it keeps
    freed pages otherwise), else glibc's ``malloc_trim(0)``; nothing where neither exists.
    """
    import ctypes

    try:
        lib = ctypes.CDLL(None)
    except (OSError, TypeError):  # no process handle (e.g. Windows)
        return
    if hasattr(lib, "MallocExtension_ReleaseFreeMemory"):
        fn = lib.MallocExtension_ReleaseFreeMemory
        fn.argtypes, fn.restype = [], None
        fn()
    elif hasattr(lib, "malloc_trim"):
        fn = lib.malloc_trim
        fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
        fn(0)
