#!/usr/bin/env bash
# Creates the virtual environment .venv (or $REVGNN_VENV) and installs revgnn with
# everything it needs. Safe to run again: finished steps are skipped.
#
#   REVGNN_NO_SCATTER=1   skip building torch-scatter (optional; ~7 min on 2 cores)
#   PYTHON=python3.11     interpreter for the venv
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${REVGNN_VENV:-.venv}"
PY="${PYTHON:-python3}"
say() { echo "[setup] $*"; }

if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV with $($PY --version)"
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
fi
PIP="$VENV/bin/python -m pip"

# torch first, pinned: a bare 'torch' (or a range, when none is installed) pulls a
# multi-GB CUDA build; 2.13.0 is the CPU wheel these machines carry.
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  say "installing torch==2.13.0"
  $PIP install -q "torch==2.13.0"
fi
say "installing revgnn (editable) and its dependencies"
$PIP install -q -e ".[dev]"

# torch-scatter: optional, never needed for correctness. PyG uses it where present (e.g. max
# scatter with grad on CUDA); revgnn's fused GEN max uses native scatter_reduce, much faster
# on CPU than torch-scatter's segment_max_csr (docs/bench/in_code.md). It must build against the
# installed torch, hence --no-build-isolation: with isolation pip would fetch a CUDA torch
# into the build environment.
if [ "${REVGNN_NO_SCATTER:-0}" != 1 ] && ! "$VENV/bin/python" -c "import torch_scatter" 2>/dev/null; then
  say "building torch-scatter from source (about 7 minutes on 2 cores)"
  $PIP install -q setuptools wheel  # the build runs in this venv (no isolation)
  $PIP install -q --no-build-isolation torch-scatter \
    || say "WARNING: torch-scatter did not build; continuing without it (slower max aggregation)"
fi

# revgnn's own C++ kernels (revgnn/csrc: the fused GENConv max aggregation and LayerNorm+ReLU), compiled for this
# CPU into torch's extension cache ($TORCH_EXTENSIONS_DIR or ~/.cache/torch_extensions) under revgnn/<key>, one
# directory per build configuration (torch, Python ABI, compiler, flags, CPU, source): another venv keeps its own
# build (about a minute, once per environment); without a compiler revgnn falls back to PyTorch.
say "building revgnn's C++ kernels (about a minute, once per environment)"
"$VENV/bin/python" -m revgnn.nn.kernels >/dev/null \
  || say "WARNING: the C++ kernels did not build; GENConv max and LayerNorm+ReLU will use the slower PyTorch path"

# tcmalloc: keeps peak RSS flat in depth and steps faster (glibc malloc fragments
# under reversible training); our entry points preload it when present.
if ! ls /usr/lib/*-linux-gnu/libtcmalloc_minimal.so.4 >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing tcmalloc (libtcmalloc-minimal4)"
    { apt-get install -y -q libtcmalloc-minimal4 >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q libtcmalloc-minimal4 >/dev/null 2>&1; }; } \
      || say "WARNING: could not install tcmalloc; memory will be less flat with glibc malloc"
  else
    say "NOTE: install tcmalloc for flat memory (Debian/Ubuntu: sudo apt-get install libtcmalloc-minimal4)"
  fi
fi
say "ready: $("$VENV/bin/python" -c 'import torch, torch_geometric; print(f"torch {torch.__version__}, PyG {torch_geometric.__version__}")')"
