r"""All of a model's parameters in one buffer, so the optimiser updates a few large tensors.

A 1001-layer RevGNN has 20,030 parameter tensors. PyTorch's CPU optimisers loop over them in
Python (``foreach`` kernels are CUDA-only by default), and keep two state tensors per parameter:
at 1001 layers Adam's step is then mostly per-tensor overhead (``benchmarks/optimizer.py``;
figures in ``docs/bench/in_code.md``), and its state is 40k small allocations.
:class:`FlatParameters` re-homes every parameter as a view into one contiguous buffer
:math:`\boldsymbol{\theta} \in \mathbb{R}^P` and every gradient as a view into a second one
:math:`\nabla\boldsymbol{\theta}` (each slice 64-byte aligned, the padding between them 0);
autograd accumulates into those views in place, and the optimiser is given the buffer as a few
chunk parameters (4 MiB each, so that its temporaries stay small).

For an optimiser whose rule is element-wise (SGD, Adam, AdamW, RMSprop, ...; see
:data:`ELEMENTWISE`), the update of every element is then *bitwise* that of the same optimiser over
the separate parameters, with one difference of convention: a parameter that receives no gradient
in a step has a zero gradient rather than none (as after ``zero_grad(set_to_none=False)``), so
momentum keeps moving it. Gradient-norm clipping over the flat gradient computes the same norm in
one reduction (equal up to rounding order).

Rules that look at a parameter's shape (Adafactor's factored moments, LAMB's per-tensor trust
ratio) are not element-wise and must not be flattened: :meth:`FlatParameters.check_optimizer`
refuses optimisers outside :data:`ELEMENTWISE`. :class:`revgnn.utils.optimizer.ModelOptimizer` builds
the optimiser over the buffer and ends each training step (sync, clip, update, clear).
"""

from __future__ import annotations

import hashlib
from typing import List, Tuple

import torch
from torch import Tensor, nn

from revgnn.utils.memory import release_free_memory

#: torch.optim classes whose update of each element depends only on that element's history.
ELEMENTWISE = (
    "SGD",
    "Adam",
    "AdamW",
    "Adamax",
    "NAdam",
    "RAdam",
    "RMSprop",
    "Adagrad",
    "Adadelta",
    "ASGD",
    "Rprop",
)

#: Alignment of every parameter's slice in the buffer (PyTorch's CPU and CUDA allocators give 64).
ALIGN_BYTES = 64

#: The optimiser sees the buffer as consecutive chunks of at most this size: an optimiser's
#: temporaries (Adam's ``sqrt(v) + eps``, ...) are then one chunk, not one more model-sized tensor.
CHUNK_BYTES = 4 * 2**20


#: Parameters and submodules registered on any module so far (PyTorch's global registration
#: hooks count them): ``sync`` walks the module again only when this moved.
_REGISTRATIONS = [0]


def _count_registration(*args) -> None:
    _REGISTRATIONS[0] += 1


torch.nn.modules.module.register_module_parameter_registration_hook(_count_registration)
torch.nn.modules.module.register_module_module_registration_hook(_count_registration)


class FlatParameters:
    r"""Moves ``module``'s trainable parameters into one buffer and their gradients into another.

    After construction, ``module`` computes exactly as before (its parameters hold the same values
    and are still leaf :class:`~torch.nn.Parameter` objects), but each parameter's storage is a
    slice of one buffer and each ``.grad`` a slice of a second (:attr:`grad`). Give the optimiser
    :attr:`params` (the buffer in chunks of at most :data:`CHUNK_BYTES`); call :meth:`zero_grad`
    (not ``optimizer.zero_grad``, which drops the gradient buffer; :meth:`sync` then raises) after
    each step and :meth:`sync` before it. On CPU the memory the parameters' old storage occupied is
    returned to the operating system (:func:`~revgnn.utils.memory.release_free_memory`).

    Build the module on its device and dtype first: a later ``module.to(...)`` replaces the
    parameters' storage and is detected by :meth:`sync`.

    Args:
        module (torch.nn.Module): The model. Frozen parameters (``requires_grad=False``) stay as
            they are. All trainable ones must share one dtype and device.

    Example:
        >>> import torch
        >>> model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        >>> flat = FlatParameters(model)
        >>> len(flat.params)  # one chunk: the whole model is smaller than CHUNK_BYTES
        1
        >>> optimizer = torch.optim.Adam(flat.params, lr=1e-3)
        >>> loss = model(torch.randn(32, 8)).square().mean()
        >>> loss.backward(); flat.sync(); optimizer.step(); flat.zero_grad()
    """

    def __init__(self, module: nn.Module):
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        if not named:
            raise ValueError(f"{type(module).__name__} has no trainable parameters to flatten")
        kinds = sorted({(str(p.dtype), str(p.device)) for _, p in named})
        if len(kinds) > 1:
            raise ValueError(
                f"FlatParameters needs one dtype and device for all trainable parameters; "
                f"{type(module).__name__} has {kinds}. Cast or move the model as a whole "
                f"first, or train without flattening (trainer.flat_params=false)."
            )
        owner: dict = {}
        for name, p in named:
            other = owner.setdefault(p.untyped_storage().data_ptr(), name)
            if other != name and p.numel() > 0:
                raise ValueError(
                    f"parameters {other!r} and {name!r} share storage (tied through views, "
                    f"or the module is already flattened); copying them into one buffer "
                    f"would untie them"
                )
        first = named[0][1]
        # Each slice starts on a 64-byte boundary, as PyTorch's allocators align every tensor:
        # BLAS kernels pick their code path by alignment, so unaligned views would round
        # differently (by ~1 ulp) from separately allocated parameters.
        align = max(1, ALIGN_BYTES // first.element_size())
        offsets, total = [], 0
        for _, p in named:
            offsets.append(total)
            total += -(-p.numel() // align) * align
        data = torch.zeros(total, dtype=first.dtype, device=first.device)  # padding stays 0
        grad = torch.zeros_like(data)
        self._entries: List[Tuple[str, nn.Parameter, Tensor, int]] = []
        with torch.no_grad():
            for (name, p), offset in zip(named, offsets):
                n = p.numel()
                view = data[offset : offset + n].view(p.shape)
                view.copy_(p)
                gview = grad[offset : offset + n].view(p.shape)
                if p.grad is not None:
                    gview.copy_(p.grad)
                p.data = view
                p.grad = gview
                self._entries.append((name, p, gview, p.data_ptr()))
        self._data, self._grad = data, grad
        self._module = module
        self._frozen = [p for p in module.parameters() if not p.requires_grad]
        self._registrations = _REGISTRATIONS[0]
        chunk = max(align, CHUNK_BYTES // first.element_size() // align * align)
        #: What to give the optimiser: the buffer as consecutive chunk parameters (views), each
        #: with its slice of the flat gradient as ``.grad``.
        self.params: List[nn.Parameter] = []
        for start in range(0, total, chunk):
            piece = nn.Parameter(data[start : start + chunk])
            piece.grad = grad[start : start + chunk]
            self.params.append(piece)
        self._chunk_grads = [piece.grad for piece in self.params]
        #: Identifies the layout (names, shapes, dtype, chunking): optimiser state saved for one
        #: layout means nothing for another.
        self.layout = hashlib.sha1(
            repr((str(first.dtype), chunk, align, [(n, tuple(p.shape)) for n, p in named])).encode()
        ).hexdigest()[:16]
        if first.device.type == "cpu":  # the parameters' old storage: back to the OS
            release_free_memory()

    @property
    def numel(self) -> int:
        """Elements of the buffer: the parameters' plus the alignment padding (kept at 0)."""
        return self._data.numel()

    @property
    def grad(self) -> Tensor:
        """The flat gradient ``[numel]``."""
        return self._grad

    @staticmethod
    def check_optimizer(optimizer: torch.optim.Optimizer) -> None:
        """Raises unless ``optimizer``'s rule is element-wise (:data:`ELEMENTWISE`)."""
        name = type(optimizer).__name__
        if type(optimizer).__module__.startswith("torch.optim") and name in ELEMENTWISE:
            return
        raise ValueError(
            f"{name} is not a known element-wise optimiser ({', '.join(ELEMENTWISE)}); over "
            f"flattened parameters its update could differ from the per-tensor one. Train "
            f"without flattening (trainer.flat_params=false)."
        )

    def sync(self) -> None:
        """Checks that every parameter still lives in the buffer, and brings gradients back into it.

        A parameter's gradient that was set to ``None`` (``model.zero_grad()``) counts as zero;
        one that was replaced by another tensor is copied in. Raises where the update would be
        silently wrong:

        * a parameter was replaced, moved or cast after flattening (``module.to(...)``,
          ``load_state_dict(assign=True)``, ``p.data = ...``) or one was frozen or unfrozen: the
          optimiser would update values the model no longer reads;
        * ``optimizer.zero_grad()`` dropped the flat gradient: the parameters' gradient views then
          still hold the previous step's values, which the last backward added to.
        """
        changed = any(p.requires_grad for p in self._frozen)
        if _REGISTRATIONS[0] != self._registrations:  # a parameter or module was (re)assigned somewhere
            changed = changed or (
                [id(p) for p in self._module.parameters() if p.requires_grad]
                != [id(p) for _, p, _, _ in self._entries]
            )
            self._registrations = _REGISTRATIONS[0]
        for piece, g in zip(self.params, self._chunk_grads):
            if piece.grad is not g:
                raise RuntimeError(
                    "the flat gradient was dropped (optimizer.zero_grad()?): gradients "
                    "accumulated onto the previous step's; zero them with "
                    "FlatParameters.zero_grad() instead"
                )
        for name, p, gview, ptr in self._entries:
            if changed or not p.requires_grad:
                raise RuntimeError(
                    "the module's trainable parameters changed after FlatParameters (a "
                    "parameter replaced, added, frozen or unfrozen); flatten the final model"
                )
            if p.data_ptr() != ptr:
                raise RuntimeError(
                    f"parameter {name!r} no longer lives in the flat buffer (was the model "
                    f"moved, cast or assigned new tensors after FlatParameters?); "
                    f"flatten after .to(device)"
                )
            g = p.grad
            if g is not gview:
                if g is None:
                    gview.zero_()
                else:
                    gview.copy_(g)
                p.grad = gview

    def zero_grad(self) -> None:
        """Zeros the flat gradient in place (never sets it to ``None``: the views must stay)."""
        self._grad.zero_()

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(tensors={len(self._entries)}, numel={self.numel})"
