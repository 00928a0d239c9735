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
  echo; echo "## Peak RSS of CLI training runs, 8 vs 1001 layers (scripts/bench_cli_memory.py)"; echo
  "$PY" scripts/bench_cli_memory.py --breakdown --out "$OUT/cli_memory.md" > "$OUT/cli_memory.log" && cat "$OUT/cli_memory.md"
  echo; echo "## Conv blocks vs memory bandwidth (scripts/bench_layers.py)"; echo
  "$PY" scripts/bench_layers.py --out "$OUT" > "$OUT/layers.log" && cat "$OUT/layers.md"
  echo; echo "## Reversible stacks vs depth: revgnn vs PyG GroupAddRev vs plain (scripts/bench_memory.py)"; echo
  "$PY" scripts/bench_memory.py --drift-depths 10,100,1001 --out "$OUT/memory" > "$OUT/memory.log" && cat "$OUT/memory/memory.md"
  echo; echo "glibc malloc instead of tcmalloc:"; echo
  "$PY" scripts/bench_memory.py --allocators system --depths 8,64 --impls revgnn,pyg --drift-depths "" \
      --out "$OUT/memory_system" > "$OUT/memory_system.log" && cat "$OUT/memory_system/memory.md"
  echo; echo "## RevGNN-Deep / Wide steps on a proteins-sized sub-graph (scripts/bench_step.py)"; echo
  "$PY" scripts/bench_step.py --model revgnn_deep --num-layers 20
  "$PY" scripts/bench_step.py --model revgnn_deep --steps 1   # all 1001 layers, ~2 min
  "$PY" scripts/bench_step.py --model revgnn_wide --num-layers 10
  echo; echo "## Optimiser step, per-tensor vs flat parameters, 1001 layers (scripts/bench_optimizer.py)"; echo
  "$PY" scripts/bench_optimizer.py
  echo; echo "## Partitioning a 79M-edge graph into 10 parts (scripts/bench_partition.py)"; echo
  "$PY" scripts/bench_partition.py
  echo; echo "## DEQ solvers and step (scripts/bench_deq.py)"; echo
  "$PY" scripts/bench_deq.py solvers
  echo; echo "## DEQ: revgnn vs torchdeq on the same maps (scripts/bench_deq.py peer; needs .[bench])"; echo
  "$PY" scripts/bench_deq.py peer --nodes 2000 --max-iter 100
  echo; echo "## SAR vs naive domain-parallel (scripts/bench_sar.py)"; echo
  "$PY" scripts/bench_sar.py --out "$OUT/sar"
  echo; echo "## SAR GENConv-max shard kernel vs one process (scripts/bench_sar_kernel.py)"; echo
  "$PY" scripts/bench_sar_kernel.py
  echo; echo "## Step time under a competing CPU load (scripts/bench_contention.py)"; echo
  "$PY" scripts/bench_contention.py --repeat 2 --out "$OUT/contention.md" > "$OUT/contention.log" && cat "$OUT/contention.md"
} 2>&1 | tee "$OUT/REPORT.md"
