r"""The one kernel-dispatch table: which implementation of each operator runs on which inputs.

Every fused operator of revgnn (:mod:`revgnn.nn.ops`, the SAR shard operators among them) has up to
three implementations of the same function:

* **C++** (``revgnn/csrc/<source>.cpp``, built by :mod:`revgnn.nn.kernels`) for CPU tensors;
* **Triton** (:mod:`revgnn.nn.triton_kernels`) for CUDA tensors, and for CPU tensors through
  Triton's interpreter under ``REVGNN_KERNELS=triton`` (``TRITON_INTERPRET=1``);
* **PyTorch**, which always exists and is what :func:`select` returning :obj:`None` means.

An operator is one :class:`KernelSpec` in :data:`KERNEL_TABLE`, registered with
:func:`register_kernel`; it names its C++ source and the Triton functions behind each of its entry
points (``forward``, ``backward``, ``shard_forward``, ...), and the dtypes each takes. The choice is
made by one function, :func:`select`, from the inputs alone:

1. ``REVGNN_KERNELS=0`` (:func:`revgnn.nn.kernels.mode`), or inputs of several dtypes or devices:
   PyTorch;
2. a CUDA tensor, or ``REVGNN_KERNELS=triton``: the Triton entry points where Triton is installed
   and the dtype is one of the operator's Triton dtypes (under ``REVGNN_KERNELS=triton`` a missing
   Triton or interpreter is an error, not a fallback), else PyTorch;
3. a CPU tensor of one of the C++ dtypes with fewer edges than the kernel's offsets can address:
   the C++ module where it built, else PyTorch.

Example:
    >>> import torch
    >>> kernel_spec("gen_max").entries
    ('forward', 'backward', 'shard_forward', 'shard_backward')
    >>> select("gen_max", torch.zeros(3, 2, dtype=torch.float16)) is None  # no fp16 kernel on CPU
    True
    >>> kernel_spec("gen_maxx")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    revgnn.utils.registry.UnknownName: unknown kernel 'gen_maxx' (did you mean 'gen_max'...
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor

from revgnn.utils.registry import Registry

__all__ = [
    "KERNEL_TABLE",
    "KernelSpec",
    "implementation",
    "kernel_spec",
    "reads_source_order",
    "register_kernel",
    "select",
]

_FLOATS = (torch.float32, torch.float64)


@dataclass(frozen=True)
class KernelSpec:
    """One operator's row of the table.

    Attributes:
        name (str): The operator's name (``"gen_max"``).
        source (str, optional): The C++ source ``revgnn/csrc/<source>.cpp`` whose module holds the
            entry points under their own names; :obj:`None` where there is no C++ implementation.
        triton (dict): Entry point -> the function of :mod:`revgnn.nn.triton_kernels` that
            implements it (empty where there is no Triton implementation).
        cpp_dtypes (tuple): The dtypes the C++ entry points take.
        triton_dtypes (tuple): The dtypes the Triton entry points take.
        max_edges (int): The C++ kernel's limit on the edge count (its int32 offsets).
        source_order (tuple): The implementations (``"cpp"``, ``"triton"``, ``"torch"``) whose
            backward reads the edges' source order (``sptr``, ``sdst``, ``sperm`` of
            :func:`revgnn.nn.graph_input.segments`); the others take empty placeholders, so a caller
            builds that order (two ``[E]`` int64 arrays and a sort) only where
            :func:`reads_source_order` says it is read.
    """

    name: str
    source: Optional[str]
    triton: Dict[str, str] = field(default_factory=dict)
    cpp_dtypes: Tuple[torch.dtype, ...] = _FLOATS
    triton_dtypes: Tuple[torch.dtype, ...] = (*_FLOATS, torch.bfloat16)
    max_edges: int = 2**31
    source_order: Tuple[str, ...] = ()

    @property
    def entries(self) -> Tuple[str, ...]:
        """The entry points every implementation of the operator provides."""
        return tuple(self.triton)


def _spec(name: str, spec: KernelSpec) -> KernelSpec:
    if not isinstance(spec, KernelSpec) or spec.name != name:
        raise TypeError(f"register_kernel({name!r}) takes a KernelSpec named {name!r}, got {spec!r}")
    return spec


#: name -> :class:`KernelSpec` of every operator with a fused implementation.
KERNEL_TABLE: Registry = Registry("kernel", _spec, how_to_add="add one with register_kernel")


def register_kernel(
    name: str,
    source: Optional[str],
    triton: Dict[str, str],
    *,
    cpp_dtypes: Tuple[torch.dtype, ...] = _FLOATS,
    triton_dtypes: Tuple[torch.dtype, ...] = (*_FLOATS, torch.bfloat16),
    max_edges: int = 2**31,
    source_order: Tuple[str, ...] = (),
) -> KernelSpec:
    """Adds operator ``name`` to :data:`KERNEL_TABLE` and returns its :class:`KernelSpec`."""
    unknown = set(source_order) - {"cpp", "triton", "torch"}
    if unknown:
        raise ValueError(f"register_kernel({name!r}): source_order names no implementation {sorted(unknown)}")
    spec = KernelSpec(
        name, source, dict(triton), tuple(cpp_dtypes), tuple(triton_dtypes), max_edges, tuple(source_order)
    )
    KERNEL_TABLE.register(name, spec)
    return spec


def kernel_spec(name: str) -> KernelSpec:
    """The :class:`KernelSpec` of ``name`` (:class:`~revgnn.utils.registry.UnknownName` if none)."""
    return KERNEL_TABLE.get(name)


# The table. Each operator of revgnn.nn.ops with a fused implementation is one row here.
register_kernel(
    "gen_max",
    "gen_max",
    {
        "forward": "gen_max_forward",
        "backward": "gen_max_backward",
        "shard_forward": "gen_max_shard_forward",
        "shard_backward": "gen_max_shard_backward",
    },
)
register_kernel(
    "layer_norm_relu",
    "layer_norm_relu",
    {"forward": "layer_norm_relu_forward", "backward": "layer_norm_relu_backward"},
)
# the linear aggregations (sum, mean, edge weights) and the plain max of SAGE, GIN and GCN (#33 a)
register_kernel(
    "aggregate",
    "aggregate",
    {"forward": "aggregate_forward", "backward": "aggregate_backward"},
    triton_dtypes=_FLOATS,
    source_order=("cpp", "triton"),
)
register_kernel(
    "segment_max",
    "segment_max",
    {"forward": "segment_max_forward", "backward": "segment_max_backward"},
    triton_dtypes=_FLOATS,
    source_order=("cpp", "triton"),
)
register_kernel(
    "gen_aggr",
    "gen_aggr",
    {"forward": "gen_aggr_forward", "backward": "gen_aggr_backward"},
    triton_dtypes=_FLOATS,  # no bfloat16: the softmax's saved maximum and denominator are x's dtype
    source_order=("triton",),  # the C++ backward walks the destination order
)
register_kernel(
    "gat_attention",
    "gat_attention",
    {"forward": "gat_attention_forward", "backward": "gat_attention_backward"},
    triton_dtypes=_FLOATS,
    source_order=("cpp", "triton"),
)


def _triton(spec: KernelSpec) -> Optional[SimpleNamespace]:
    """The Triton entry points of ``spec`` as a namespace (with ``interpreted``), or :obj:`None` where
    Triton is not installed or the operator has no Triton implementation."""
    if not spec.triton:
        return None
    from revgnn.nn import triton_kernels as tk

    if not tk.AVAILABLE:
        return None
    return SimpleNamespace(
        **{entry: getattr(tk, function) for entry, function in spec.triton.items()},
        interpreted=tk.INTERPRETED,
    )


def _cpp(spec: KernelSpec):
    from revgnn.nn import kernels

    return kernels.load(spec.source) if spec.source is not None else None


def implementation(name: str, x: Tensor, *others: Optional[Tensor], num_edges: int = 0) -> str:
    """``"cpp"``, ``"triton"`` or ``"torch"``: which implementation of ``name`` runs on these
    inputs (:func:`select`)."""
    module = select(name, x, *others, num_edges=num_edges)
    if module is None:
        return "torch"
    return "triton" if isinstance(module, SimpleNamespace) else "cpp"


def reads_source_order(name: str, x: Tensor, *others: Optional[Tensor], num_edges: int = 0) -> bool:
    """Whether the implementation of ``name`` that runs on these inputs (:func:`implementation`) has a
    backward that reads the edges' source order (:attr:`KernelSpec.source_order`)."""
    return implementation(name, x, *others, num_edges=num_edges) in kernel_spec(name).source_order


def select(name: str, x: Tensor, *others: Optional[Tensor], num_edges: int = 0):
    """The module-like object whose entry points (:attr:`KernelSpec.entries`) compute operator
    ``name`` on these inputs, or :obj:`None` for its PyTorch implementation; the rule is the module
    docstring's. ``others`` are the operator's other floating-point inputs (:obj:`None` allowed),
    which must share ``x``'s dtype and device for a kernel to run; ``num_edges`` the edge count."""
    from revgnn.nn import kernels

    spec = kernel_spec(name)
    mode = kernels.mode()
    if mode == "off" or not all(t is None or (t.dtype == x.dtype and t.device == x.device) for t in others):
        return None
    if mode == "triton" or x.device.type == "cuda":
        module = _triton(spec) if x.dtype in spec.triton_dtypes else None
        if mode == "triton" and (module is None or (x.device.type == "cpu" and not module.interpreted)):
            raise RuntimeError(
                f"REVGNN_KERNELS=triton: no Triton implementation of {name!r} for {x.dtype} here; it needs "
                "Triton (pip install triton) and, for CPU tensors, TRITON_INTERPRET=1 set before Triton "
                "is first imported"
            )
        return module
    if x.device.type == "cpu" and x.dtype in spec.cpp_dtypes and num_edges < spec.max_edges:
        return _cpp(spec)
    return None
