"""Compiled CPU kernels (``revgnn/csrc``), built on first use and cached.

The C++ sources are compiled with :func:`torch.utils.cpp_extension.load`
(needs a C++ compiler and ``ninja``; ``scripts/setup.sh`` builds them ahead of
time) for the machine they run on (``-O3 -march=native``). The build lives in
torch's extension cache (``$TORCH_EXTENSIONS_DIR``, default
``~/.cache/torch_extensions``) under a name that includes a hash of the source
and of this CPU's feature flags, so a cache shared between different machines
never hands one a binary for another's instruction set.

Where a kernel cannot be built, its accessor (:func:`gen_max`,
:func:`layer_norm_relu`) returns :obj:`None` after one warning and callers fall
back to their PyTorch implementation (same function, slower).
``REVGNN_KERNELS=0`` turns the kernels off.

    python -m revgnn.nn.kernels      # build them all now (verbose) and say where
"""
from __future__ import annotations

import hashlib
import os
import platform
import warnings
from functools import lru_cache
from pathlib import Path
from types import ModuleType
from typing import Optional

SOURCE_DIR = Path(__file__).resolve().parent.parent / "csrc"


def enabled() -> bool:
    """False when ``REVGNN_KERNELS=0`` (or ``false``/``off``)."""
    return os.environ.get("REVGNN_KERNELS", "1").strip().lower() not in ("0", "false", "off", "no")


def _cpu_signature() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
        flags = next((line for line in text.splitlines() if line.startswith("flags")), "")
    except OSError:
        flags = ""
    return flags or platform.processor() or platform.machine()


def _build(name: str, verbose: bool = False) -> ModuleType:
    from torch.utils.cpp_extension import load

    source = SOURCE_DIR / f"{name}.cpp"
    digest = hashlib.sha1(source.read_bytes() + _cpu_signature().encode()).hexdigest()[:12]
    flags = ["-O3", "-march=native", "-fopenmp", "-DNDEBUG"]
    return load(name=f"revgnn_{name}_{digest}", sources=[str(source)], extra_cflags=flags,
                extra_ldflags=["-fopenmp"], verbose=verbose)


@lru_cache(maxsize=None)
def _load(name: str) -> Optional[ModuleType]:
    if not enabled():
        return None
    try:
        return _build(name)
    except Exception as err:  # no compiler, no ninja, unsupported platform: fall back
        warnings.warn(f"revgnn: could not build the C++ kernel {name!r} ({type(err).__name__}: "
                      f"{str(err).strip().splitlines()[-1] if str(err).strip() else err}); using the "
                      "slower PyTorch path. Install a C++ compiler and `pip install ninja`, or set "
                      "REVGNN_KERNELS=0 to silence this.", RuntimeWarning, stacklevel=3)
        return None


def gen_max() -> Optional[ModuleType]:
    """The fused GENConv-max kernel module (``forward``/``backward``), or :obj:`None`."""
    return _load("gen_max")


def layer_norm_relu() -> Optional[ModuleType]:
    """The fused LayerNorm + ReLU (+ mask) kernel module (``forward``/``backward``), or :obj:`None`."""
    return _load("layer_norm_relu")


KERNELS = ("gen_max", "layer_norm_relu")

if __name__ == "__main__":
    for kernel in KERNELS:
        module = _build(kernel, verbose=True)
        print(f"built {module.__name__} from {SOURCE_DIR / f'{kernel}.cpp'}: {module.__file__}")
