#!/usr/bin/env bash
# The prepared GPU check (<= 10 minutes on one GPU): CUDA correctness tests, the Triton kernels'
# check (scripts/gpu_check_triton.py), then one
# RevGNN-Deep (1001 x 80) training step on a proteins-sized generated sub-graph
# (13.2k nodes, 0.79M edges), fp32, bf16 autocast, and bf16 with the exact coupling
# (quantize=16): peak max_memory_allocated and
# step time, next to the paper's 2.86 GB / ~58 s per step on a V100; the same step with PyG's
# GroupAddRev; one full-graph step (100 layers) on a generated graph of ogbn-proteins' size.
# Writes JSON lines to ${OUT:-gpu_out}/gpu_check.jsonl.
#
# Python: $PYTHON as it is when set; else python3 if it has a CUDA torch, PyG and pytest (an offline
# GPU image: torch 2.11+cu130, triton 3.6, torch-geometric 2.8.0.post1, pytest), else a .venv-gpu
# made with pip (needs the package index). Beyond those, the check imports revgnn's model registry, which
# needs hydra-core and omegaconf (and antlr4-python3-runtime, theirs); torch-scatter is optional.
# An image without them takes them as wheels in .whl/ (pure Python; git ignores .whl/), made where
# pip reaches the index (antlr4 4.9.3 has no wheel there: pip builds one, pure Python too):
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 -d .whl hydra-core==1.3.8 omegaconf==2.3.1
#   python3 -m pip wheel --no-deps -w .whl antlr4-python3-runtime==4.9.3
# which this script installs with --no-index into $GPU_SITE (default /tmp/site) first.
#
# Every part runs even when an earlier one failed (each failure is listed at the end, exit 1), and
# each part's timeout is capped by what is left of GPU_CHECK_BUDGET seconds (default 570), so the
# whole check ends within it; a part with under 30 s left is skipped and says so.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${OUT:-gpu_out}"; mkdir -p "$OUT_DIR"
JSONL="$OUT_DIR/gpu_check.jsonl"
BUDGET="${GPU_CHECK_BUDGET:-570}"
FAILED=()
if compgen -G ".whl/*.whl" >/dev/null; then
  SITE="${GPU_SITE:-/tmp/site}"
  "${PYTHON:-python3}" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" .whl/*.whl
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
if [ -n "${PYTHON:-}" ]; then
  PY="$PYTHON"  # the caller's choice: used as it is
elif python3 -c "import torch, torch_geometric, pytest; assert torch.cuda.is_available()" 2>/dev/null; then
  PY=python3
else
  VENV=.venv-gpu
  if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip
    # a CUDA build of torch (PyPI's default wheel); torch-scatter is optional and skipped
    "$VENV/bin/python" -m pip install -q "torch>=2.6"
    "$VENV/bin/python" -m pip install -q -e ".[dev]"
  fi
  PY="$VENV/bin/python"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# everything the parts below import, before any of them runs
"$PY" -c "import torch, torch_geometric, pytest, triton, hydra, omegaconf, revgnn.models, benchmarks.step" || {
  echo "gpu_check: $PY lacks a package the check imports (above); carry hydra-core, omegaconf and" \
    "antlr4-python3-runtime as wheels in .whl/ (this script's header)" >&2
  exit 1
}
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name(), 'torch', torch.__version__)"

# seconds for the next part: its own limit, capped by what is left of the budget; 0 = skip it
limit() {
  local left=$((BUDGET - SECONDS))
  if [ "$left" -lt 30 ]; then echo 0; elif [ "$left" -lt "$1" ]; then echo "$left"; else echo "$1"; fi
}
# run NAME LIMIT CMD...: CMD under timeout (capped); a failure or a skip is recorded, not fatal
run() {
  local name="$1" t; t="$(limit "$2")"; shift 2
  if [ "$t" -eq 0 ]; then
    echo "{\"check\": \"$name\", \"skipped\": \"GPU_CHECK_BUDGET=$BUDGET s spent\"}" | tee -a "$JSONL" >&2
    FAILED+=("$name (skipped)")
    return 0
  fi
  timeout "$t" "$@" || FAILED+=("$name (exit $?)")
}
step() {  # step NAME LIMIT PREFIX ARGS...: one benchmarks.step run, its JSON line prefixed
  local name="$1" lim="$2" prefix="$3"; shift 3
  run "$name" "$lim" "$PY" -m benchmarks.step --model revgnn_deep --device cuda "$@" >"$OUT_DIR/step.tmp" || true
  sed "s/^{/{$prefix/" "$OUT_DIR/step.tmp" | tee -a "$JSONL"
}

# REVGNN_KERNELS=0: the C++ kernels are CPU-only (CI tests them); building them here would cost
# about a minute of the budget, and the GPU image may lack ninja.
REVGNN_KERNELS=0 run tests 180 "$PY" -m pytest tests/nn/test_cuda.py tests/nn/test_group_rev.py tests/nn/test_gen_max.py -q \
  >"$OUT_DIR/tests.log" 2>&1 || true
tail -n 15 "$OUT_DIR/tests.log"
# the Triton kernels (the operators' CUDA implementation) against a float64 PyTorch reference, then
# the same step through them (REVGNN_KERNELS=1, the default) and through the PyTorch path (=0)
run triton 300 "$PY" scripts/gpu_check_triton.py >"$OUT_DIR/triton.tmp" || true
tee -a "$JSONL" <"$OUT_DIR/triton.tmp"
for kernels in 1 0; do
  for flags in "" "--bf16" "--bf16 --quantize 16"; do
    # shellcheck disable=SC2086  # $flags: zero, one or two arguments
    REVGNN_KERNELS=$kernels step "step kernels=$kernels $flags" 120 "\"revgnn_kernels\": $kernels, " --steps 2 $flags
  done
done
# the same step with PyG's GroupAddRev around the same groups (our kernels inside), side by side
step "step pyg" 120 "" --steps 1 --reversible pyg
# one full-graph step on a generated graph of ogbn-proteins' size (132,534 nodes, 79,122,504 directed
# edges, 8-d edge features) through the Triton kernels: 100 layers (memory is flat in depth; the
# 1001-layer time is extrapolated from the per-layer time and says so)
step "full graph" 240 "\"full_graph\": true, " --steps 1 --num-layers 100 --nodes 132534 --edges 79122504
rm -f "$OUT_DIR/step.tmp" "$OUT_DIR/triton.tmp"
echo "paper (V100, RevGNN-Deep): 2.86 GB peak, ~58 s per step"
if [ "${#FAILED[@]}" -gt 0 ]; then
  printf 'gpu_check: failed: %s\n' "${FAILED[@]}" >&2
  exit 1
fi
echo "gpu_check: all parts passed"
