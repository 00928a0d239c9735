#!/usr/bin/env bash
# The numerics matrix (docs/testing.md): the kernel, solver and model tests once per combination of
# revgnn's kernel build level (REVGNN_KERNEL_ARCH: native, x86-64-v2, -v3, -v4) and torch's SIMD level
# (ATEN_CPU_CAPABILITY: default, avx2, avx512), so that one machine shows the rounding of others.
# Each kernel level builds once into its own cache directory (about a minute); a level this CPU cannot
# run is skipped with a note. Assumes the venv of scripts/setup.sh.
#
#   bash scripts/test_matrix.sh                    every combination, the full subset (~25 min on 2 cores)
#   bash scripts/test_matrix.sh x86-64-v2:avx2     one combination (LEVEL:CAPABILITY), the full subset
#   bash scripts/test_matrix.sh --quick LEVEL:CAP  the cheap subset that scripts/test.sh runs
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${REVGNN_VENV:-.venv}/bin/python"

# kernels, solvers and models: every test whose floats depend on the CPU's rounding
FULL=(tests/nn/test_gen_max.py tests/nn/test_gen_aggr.py tests/nn/test_linear_aggr.py tests/nn/test_gat.py
  tests/nn/test_norm_act.py tests/nn/test_kernel_threads.py
  tests/nn/test_group_rev.py tests/nn/test_invertible_contract.py tests/nn/test_graph_norms.py
  tests/nn/test_conv_registry.py tests/distributed/test_sar_kernels.py
  tests/deq/test_deq_solvers.py tests/deq/test_deq_module.py tests/deq/test_deq_options.py
  tests/deq/test_deq_norm.py tests/deq/test_deq_regularize.py tests/deq/test_deq_graph_batch.py
  tests/models/test_deq_gnn.py tests/models/test_models.py tests/models/test_zoo.py tests/utils/test_flat.py)
# the three tests that failed on another CPU, the kernels against PyTorch and across thread counts
QUICK=(tests/nn/test_gen_max.py tests/nn/test_norm_act.py tests/nn/test_kernel_threads.py
  tests/models/test_deq_gnn.py tests/deq/test_deq_module.py)

subset=("${FULL[@]}")
if [ "${1:-}" = "--quick" ]; then
  subset=("${QUICK[@]}")
  shift
fi
combos=("$@")
if [ ${#combos[@]} -eq 0 ]; then
  for level in native x86-64-v2 x86-64-v3 x86-64-v4; do
    for cap in default avx2 avx512; do combos+=("$level:$cap"); done
  done
fi

for combo in "${combos[@]}"; do
  level="${combo%%:*}" cap="${combo#*:}"
  if ! why=$(REVGNN_KERNEL_ARCH="$level" "$PY" -c "from revgnn.nn import kernels; kernels.arch()" 2>&1); then
    echo "[matrix] $combo skipped: ${why##*$'\n'}"
    continue
  fi
  echo "[matrix] REVGNN_KERNEL_ARCH=$level ATEN_CPU_CAPABILITY=$cap: ${#subset[@]} test files"
  REVGNN_KERNEL_ARCH="$level" "$PY" -m revgnn.nn.kernels >/dev/null  # the build first, one line, not under pytest
  REVGNN_KERNEL_ARCH="$level" ATEN_CPU_CAPABILITY="$cap" "$PY" -m pytest -q -p no:cacheprovider "${subset[@]}"
done
