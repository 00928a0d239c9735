"""Compiled CPU kernels (``revgnn/csrc``), built once per environment and cached.

The C++ sources are compiled with :func:`torch.utils.cpp_extension.load`
(needs a C++ compiler and ``ninja``; ``scripts/setup.sh`` builds them ahead of
time) for the machine they run on (``-O3 -march=native``), or for a portable
instruction-set level chosen by ``REVGNN_KERNEL_ARCH``:

========================  =====================================================
``native`` (default)      this CPU's every extension (AVX-512 where it has it)
``x86-64-v2``             SSE4.2: any x86-64 CPU since about 2009, no FMA
``x86-64-v3``             AVX2 + FMA (Haswell, Zen and later)
``x86-64-v4``             AVX-512 F/BW/CD/DQ/VL
========================  =====================================================

A portable build runs on every CPU of its level, so a cluster can build once
and run anywhere (the CPU it was built on is then not part of its key); loading
one on a CPU that lacks the level's instructions is an error naming the missing
flags. The level also changes results in the last bits (FMA contraction, vector
width): the test matrix of ``docs/testing.md`` runs the kernels at each.

**Cache layout.** Builds live under torch's extension root
(``$TORCH_EXTENSIONS_DIR``, default ``~/.cache/torch_extensions``) in a
directory keyed by everything that makes two binaries differ::

    <root>/revgnn/torch<version>-<SOABI>-<hash>/<kernel>-<source hash>/

where ``<hash>`` covers the torch version, git and CUDA/HIP build tags and C++
ABI, the Python extension ABI (``EXT_SUFFIX``), the compiler (resolved path and
``--version``), the compile and link flags (the ``-march`` level among them)
and, for ``-march=native`` only, this CPU's feature flags, and ``<source hash>``
the kernel's source. Two virtual
environments (another torch, another Python, another compiler) therefore get
two directories and never rebuild each other's kernels; two environments with
the same key share one build. A finished build is marked by ``built.json`` (the
key, readable) and loaded straight from its ``.so`` afterwards, without running
ninja or the compiler (where the compiler has gone since, a finished build of the same key but
for the compiler is used). A build logs one line when it starts ("building revgnn
C++ kernels, about a minute, once per environment") and one when it is done
(logger ``revgnn.nn.kernels``; printed to stderr when logging is not set up).

Where a kernel cannot be built, :func:`load` returns :obj:`None` after one warning and the
operators fall back to their PyTorch implementation (same function, slower).
``REVGNN_KERNELS=0`` turns the kernels off; ``REVGNN_KERNELS=triton`` takes the Triton kernels
(:mod:`revgnn.nn.triton_kernels`) for every tensor, which on CPU tensors run in Triton's interpreter
(``TRITON_INTERPRET=1``): how CI checks the GPU path without a GPU. Which implementation of an
operator runs on which inputs is decided in one place, the dispatch table
(:mod:`revgnn.nn.dispatch`).

    python -m revgnn.nn.kernels      # build them all now (verbose) and say where
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import time
import warnings
from functools import lru_cache
from pathlib import Path
from types import ModuleType
from typing import Dict, Optional

SOURCE_DIR = Path(__file__).resolve().parent.parent / "csrc"
#: ``REVGNN_KERNEL_ARCH`` levels: the ``/proc/cpuinfo`` flags each needs (beyond the level below).
ARCHES: Dict[str, tuple] = {
    "native": (),
    "x86-64-v2": ("cx16", "lahf_lm", "popcnt", "pni", "sse4_1", "sse4_2", "ssse3"),
    "x86-64-v3": ("avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"),
    "x86-64-v4": ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"),
}
LDFLAGS = ("-fopenmp",)


def sources() -> list:
    """The kernels' sources: the stems of ``revgnn/csrc/*.cpp``, each one extension module, sorted.
    Which operator uses which is the dispatch table's (:mod:`revgnn.nn.dispatch`)."""
    return sorted(path.stem for path in SOURCE_DIR.glob("*.cpp"))


MARKER = "built.json"
_LAYOUT = "2"  # bump when the cache layout or the key's meaning changes

log = logging.getLogger(__name__)


def mode() -> str:
    """``REVGNN_KERNELS``: ``"native"`` (default: the C++ kernels on CPU, the Triton ones on CUDA),
    ``"triton"`` (the Triton kernels for every tensor: CPU tensors need ``TRITON_INTERPRET=1``, set
    before Triton is first imported) or ``"off"`` (``0``/``false``/``off``/``no``: PyTorch only)."""
    value = os.environ.get("REVGNN_KERNELS", "1").strip().lower()
    if value in ("0", "false", "off", "no"):
        return "off"
    if value == "triton":
        return "triton"
    if value in ("1", "true", "on", "yes", "native", ""):
        return "native"
    raise ValueError(f"REVGNN_KERNELS={value!r}: use 1 (native, the default), triton, or 0 (off)")


def enabled() -> bool:
    """False when ``REVGNN_KERNELS=0`` (or ``false``/``off``)."""
    return mode() != "off"


def _cpu_flags() -> str:
    """The ``flags`` line of ``/proc/cpuinfo`` (empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
        return next((line for line in text.splitlines() if line.startswith("flags")), "")
    except OSError:
        return ""


def _cpu_signature() -> str:
    return _cpu_flags() or platform.processor() or platform.machine()


def arch() -> str:
    """The ``-march`` level of the kernels: ``$REVGNN_KERNEL_ARCH`` (default ``native``), checked
    against :data:`ARCHES` and against this CPU: a level it cannot run is a :class:`ValueError`
    naming the missing instructions."""
    level = os.environ.get("REVGNN_KERNEL_ARCH", "native").strip() or "native"
    if level not in ARCHES:
        raise ValueError(
            f"REVGNN_KERNEL_ARCH={level!r} is not a level revgnn builds; choose one of {list(ARCHES)}"
        )
    if level == "native":
        return level
    if platform.machine().lower() not in ("x86_64", "amd64"):
        raise ValueError(
            f"REVGNN_KERNEL_ARCH={level} is an x86-64 level; this is {platform.machine()}: use native"
        )
    names = list(ARCHES)
    needed = [f for lvl in names[1 : names.index(level) + 1] for f in ARCHES[lvl]]
    have = set(_cpu_flags().split(":", 1)[-1].split())
    missing = [f for f in needed if f not in have] if have else []
    if missing:
        raise ValueError(
            f"REVGNN_KERNEL_ARCH={level}: this CPU lacks {', '.join(missing)}; choose a lower level or native"
        )
    return level


def cflags() -> tuple:
    """The compile flags: ``-O3 -march=<arch()> -fopenmp -DNDEBUG``."""
    return ("-O3", f"-march={arch()}", "-fopenmp", "-DNDEBUG")


def _compiler() -> str:
    """The compiler torch's build will run (``$CXX`` or ``c++``): resolved path and version line."""
    cxx = os.environ.get("CXX", "c++")
    path = shutil.which(cxx)
    if path is None:
        return f"{cxx} (not found)"
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
        version = out.strip().splitlines()[0] if out.strip() else "?"
    except (OSError, subprocess.SubprocessError):
        version = "?"
    return f"{os.path.realpath(path)} {version}"


def _torch_parts() -> Dict[str, str]:
    import torch

    return {
        "torch": torch.__version__,
        "torch_git": str(getattr(torch.version, "git_version", "")),
        "torch_cuda": str(torch.version.cuda),
        "torch_hip": str(getattr(torch.version, "hip", None)),
        "cxx11_abi": str(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", "?")),
    }


def environment_key() -> Dict[str, str]:
    """What makes a kernel binary built here differ from one built elsewhere (the source aside)."""
    return _environment_key(arch())


@lru_cache(maxsize=None)
def _environment_key(level: str) -> Dict[str, str]:
    flags = cflags()
    native = level == "native"
    return {
        "layout": _LAYOUT,
        **_torch_parts(),
        "python_abi": str(sysconfig.get_config_var("EXT_SUFFIX") or sys.implementation.cache_tag),
        "compiler": _compiler(),
        "cflags": " ".join(flags),
        "ldflags": " ".join(LDFLAGS),
        # a -march=native binary is this CPU's; a portable level's runs on any CPU of that level
        "cpu": hashlib.sha1(_cpu_signature().encode()).hexdigest() if native else "any",
    }


def _digest(text: str, n: int = 12) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:n]


def _source_hash(name: str) -> str:
    return hashlib.sha1((SOURCE_DIR / f"{name}.cpp").read_bytes()).hexdigest()[:12]


def cache_root() -> Path:
    """``<torch extensions root>/revgnn``: ``$TORCH_EXTENSIONS_DIR`` or ``~/.cache/torch_extensions``."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if not root:
        from torch.utils.cpp_extension import get_default_build_root

        root = get_default_build_root()
    return Path(root) / "revgnn"


def environment_dir(key: Optional[Dict[str, str]] = None) -> Path:
    """This environment's build directory: ``<cache_root>/torch<version>-<SOABI>-<hash>``."""
    key = environment_key() if key is None else key
    soabi = str(sysconfig.get_config_var("SOABI") or sys.implementation.cache_tag)
    tag = re.sub(r"[^A-Za-z0-9._+-]", "_", f"torch{key['torch']}-{soabi}")
    return cache_root() / f"{tag}-{_digest(json.dumps(key, sort_keys=True))}"


def build_dir(name: str, key: Optional[Dict[str, str]] = None) -> Path:
    """Where kernel ``name`` is (or will be) built for this environment."""
    return environment_dir(key) / f"{name}-{_source_hash(name)}"


def module_name(name: str, key: Optional[Dict[str, str]] = None) -> str:
    """The extension's module name: unique per (environment key, source), so that two builds never
    clash in ``sys.modules``."""
    key = environment_key() if key is None else key
    return f"revgnn_{name}_{_digest(json.dumps(key, sort_keys=True) + _source_hash(name))}"


def _say(message: str) -> None:
    if log.hasHandlers():
        log.info(message)
    else:  # logging not set up (plain Python API use): the line is still seen
        print(f"[revgnn] {message}", file=sys.stderr, flush=True)


def _import(name: str, path: Path) -> ModuleType:
    import torch  # noqa: F401  (the extension needs libtorch loaded)

    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _compile(name: str, directory: Path, module: str, verbose: bool) -> ModuleType:
    """Runs torch's ninja build of kernel ``name`` in ``directory``; returns the loaded module."""
    from torch.utils.cpp_extension import load

    return load(
        name=module,
        sources=[str(SOURCE_DIR / f"{name}.cpp")],
        extra_cflags=list(cflags()),
        extra_ldflags=list(LDFLAGS),
        build_directory=str(directory),
        verbose=verbose,
    )


def _build(name: str, verbose: bool = False) -> ModuleType:
    """Kernel ``name`` for this environment: loaded from its cache directory when a finished build is
    there, else built into it (one log line at the start, one at the end)."""
    key = environment_key()
    directory, module = build_dir(name, key), module_name(name, key)
    library = directory / f"{module}.so"
    if (directory / MARKER).is_file() and library.is_file():
        try:
            return _import(module, library)
        except ImportError as err:  # e.g. a library it links was removed: build again
            log.warning("revgnn: cached kernel %s did not load (%s); rebuilding", library, err)
    if key["compiler"].endswith("(not found)"):  # no compiler now: a build made with one still serves
        same = {k: v for k, v in key.items() if k != "compiler"}
        for marker in sorted(environment_dir(key).parent.glob(f"*/{directory.name}/{MARKER}")):
            try:
                built = json.loads(marker.read_text())
                other = {k: v for k, v in built.items() if k not in ("compiler", "kernel", "source")}
                so = next(marker.parent.glob("revgnn_*.so"), None)
                if other == same and so is not None:
                    return _import(so.stem, so)
            except (OSError, ValueError, ImportError):
                continue
        raise RuntimeError(f"no C++ compiler: {key['compiler']} (set CXX, or install g++)")
    directory.mkdir(parents=True, exist_ok=True)
    _say(f"building revgnn C++ kernels ({name}), about a minute, once per environment, into {directory}")
    start = time.perf_counter()
    result = _compile(name, directory, module, verbose)
    tmp = directory / f".{MARKER}.{os.getpid()}"
    tmp.write_text(json.dumps({**key, "kernel": name, "source": _source_hash(name)}, indent=1))
    os.replace(tmp, directory / MARKER)
    _say(f"built revgnn C++ kernel {name} in {time.perf_counter() - start:.0f} s")
    return result


def load(name: str) -> Optional[ModuleType]:
    """The C++ module built from ``revgnn/csrc/<name>.cpp``, or :obj:`None` while ``REVGNN_KERNELS=0``
    (read on every call, so that setting it back within a process turns the kernels on again) or
    where it does not build. Which operator runs which module is the dispatch table's
    (:mod:`revgnn.nn.dispatch`)."""
    return _built(name) if enabled() else None


@lru_cache(maxsize=None)
def _built(name: str) -> Optional[ModuleType]:
    arch()  # an impossible REVGNN_KERNEL_ARCH is the user's error, not a reason to fall back
    try:
        return _build(name)
    except Exception as err:  # no compiler, no ninja, unsupported platform: fall back
        warnings.warn(
            f"revgnn: could not build the C++ kernel {name!r} ({type(err).__name__}: "
            f"{str(err).strip().splitlines()[-1] if str(err).strip() else err}); using the "
            "slower PyTorch path. Install a C++ compiler and `pip install ninja`, or set "
            "REVGNN_KERNELS=0 to silence this.",
            RuntimeWarning,
            stacklevel=3,
        )
        return None


if __name__ == "__main__":
    log.addHandler(logging.StreamHandler())  # the build's start and end lines, on stderr
    log.setLevel(logging.INFO)
    for kernel in sources():
        module = _build(kernel, verbose=True)
        print(f"built {module.__name__} from {SOURCE_DIR / f'{kernel}.cpp'}: {module.__file__}")
