#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh) and runs the main job: revgnn-train with its
# defaults trains RevGNN on the embedded proteins_like graph. Extra arguments are
# Hydra overrides, e.g. `bash scripts/run.sh experiment=proteins_revgnn_deep`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec "${REVGNN_VENV:-.venv}/bin/revgnn-train" "$@"
