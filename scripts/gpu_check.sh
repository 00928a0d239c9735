#!/usr/bin/env bash
# The prepared GPU check (<= 10 minutes on one GPU): CUDA correctness tests, the Triton kernels'
# check (scripts/gpu_check_triton.py), then one
# RevGNN-Deep (1001 x 80) training step on a proteins-sized generated sub-graph
# (13.2k nodes, 0.79M edges), fp32, bf16 autocast, and bf16 with the exact coupling
# (quantize=16): peak max_memory_allocated and
# step time, next to the paper's 2.86 GB / ~58 s per step on a V100; the same step with PyG's
# GroupAddRev; one full-graph step (100 layers) on a generated graph of ogbn-proteins' size.
# Writes JSON lines to ${OUT:-gpu_out}/gpu_check.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${OUT:-gpu_out}"; mkdir -p "$OUT_DIR"
# The checks need only torch (CUDA build), PyG and pytest. Use an interpreter that already has
# them (GPU machines are often offline: PYTHON=..., default python3); otherwise make .venv-gpu.
PY="${PYTHON:-python3}"
if ! "$PY" -c "import torch, torch_geometric, pytest; assert torch.cuda.is_available()" 2>/dev/null; then
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
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name(), 'torch', torch.__version__)"
# REVGNN_KERNELS=0: the C++ kernels are CPU-only (CI tests them); building them here would cost
# about a minute of the budget, and the GPU image may lack ninja.
REVGNN_KERNELS=0 "$PY" -m pytest tests/nn/test_cuda.py tests/nn/test_group_rev.py tests/nn/test_gen_max.py -q 2>&1 | tee "$OUT_DIR/tests.log"
# the Triton kernels (the operators' CUDA implementation) against a float64 PyTorch reference, then
# the same step through them (REVGNN_KERNELS=1, the default) and through the PyTorch path (=0)
timeout 300 "$PY" scripts/gpu_check_triton.py | tee -a "$OUT_DIR/gpu_check.jsonl"
for kernels in 1 0; do
  for flags in "" "--bf16" "--bf16 --quantize 16"; do
    REVGNN_KERNELS=$kernels timeout 120 "$PY" -m benchmarks.step --model revgnn_deep --device cuda --steps 2 $flags \
      | sed "s/^{/{\"revgnn_kernels\": $kernels, /" | tee -a "$OUT_DIR/gpu_check.jsonl"
  done
done
# the same step with PyG's GroupAddRev around the same groups (our kernels inside), side by side
timeout 120 "$PY" -m benchmarks.step --model revgnn_deep --device cuda --steps 1 --reversible pyg \
  | tee -a "$OUT_DIR/gpu_check.jsonl"
# one full-graph step on a generated graph of ogbn-proteins' size (132,534 nodes, 79,122,504 directed
# edges, 8-d edge features) through the Triton kernels: 100 layers (memory is flat in depth; the
# 1001-layer time is extrapolated from the per-layer time and says so)
timeout 240 "$PY" -m benchmarks.step --model revgnn_deep --device cuda --steps 1 --num-layers 100 \
  --nodes 132534 --edges 79122504 | sed 's/^{/{"full_graph": true, /' | tee -a "$OUT_DIR/gpu_check.jsonl"
echo "paper (V100, RevGNN-Deep): 2.86 GB peak, ~58 s per step"
