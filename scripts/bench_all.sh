#!/usr/bin/env bash
# Runs every benchmark with its defaults and collects the results into bench_out/REPORT.md
# (markdown tables; PNG plots next to it). Takes about an hour on 2 CPU cores; nothing else
# should run meanwhile, since every comparison is timed side by side on the same cores.
#   bash scripts/bench_all.sh            # after scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${REVGNN_VENV:-.venv}/bin/python"
OUT=bench_out; mkdir -p "$OUT"
{
  echo "# revgnn benchmarks ($(date -u +%F), $(nproc) cores, $("$PY" -c 'import torch; print("torch", torch.__version__)'))"
  echo; echo "## Peak RSS of CLI training runs, 8 vs 1001 layers (benchmarks/cli_memory.py)"; echo
  "$PY" -m benchmarks.cli_memory --breakdown --out "$OUT/cli_memory.md" > "$OUT/cli_memory.log" && cat "$OUT/cli_memory.md"
  echo; echo "## Conv blocks vs memory bandwidth (benchmarks/layers.py)"; echo
  "$PY" -m benchmarks.layers --out "$OUT" > "$OUT/layers.log" && cat "$OUT/layers.md"
  echo; echo "## Reversible stacks vs depth: revgnn vs PyG GroupAddRev vs plain (benchmarks/memory.py)"; echo
  "$PY" -m benchmarks.memory --drift-depths 10,100,1001 --out "$OUT/memory" > "$OUT/memory.log" && cat "$OUT/memory/memory.md"
  echo; echo "glibc malloc instead of tcmalloc:"; echo
  "$PY" -m benchmarks.memory --allocators system --depths 8,64 --impls revgnn,pyg --drift-depths "" \
      --out "$OUT/memory_system" > "$OUT/memory_system.log" && cat "$OUT/memory_system/memory.md"
  echo; echo "## RevGNN-Deep / Wide steps on a proteins-sized sub-graph (benchmarks/step.py)"; echo
  "$PY" -m benchmarks.step --model revgnn_deep --num-layers 20
  "$PY" -m benchmarks.step --model revgnn_deep --steps 1   # all 1001 layers, ~2 min
  "$PY" -m benchmarks.step --model revgnn_wide --num-layers 10
  echo; echo "## Optimiser step, per-tensor vs flat parameters, 1001 layers (benchmarks/optimizer.py)"; echo
  "$PY" -m benchmarks.optimizer
  echo; echo "## Partitioning a 79M-edge graph into 10 parts (benchmarks/partition.py)"; echo
  "$PY" -m benchmarks.partition
  echo; echo "## DEQ solvers and step (benchmarks/deq/)"; echo
  "$PY" -m benchmarks.deq solvers
  echo; echo "## DEQ: revgnn vs torchdeq on the same maps (benchmarks.deq peer; needs .[bench])"; echo
  "$PY" -m benchmarks.deq peer --nodes 2000 --max-iter 100
  echo; echo "## SAR vs naive domain-parallel (benchmarks/sar.py)"; echo
  "$PY" -m benchmarks.sar --out "$OUT/sar"
  echo; echo "## SAR GENConv-max shard kernel vs one process (benchmarks/sar_kernel.py)"; echo
  "$PY" -m benchmarks.sar_kernel
  echo; echo "## Step time under a competing CPU load (benchmarks/contention.py)"; echo
  "$PY" -m benchmarks.contention --repeat 2 --out "$OUT/contention.md" > "$OUT/contention.log" && cat "$OUT/contention.md"
} 2>&1 | tee "$OUT/REPORT.md"
