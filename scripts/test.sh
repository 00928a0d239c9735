#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh), checks formatting and lint (ruff, configured in
# pyproject.toml), builds the docs and runs the docstring examples (scripts/docs.sh), runs the
# test suite, then the cheap subset of the numerics matrix with the kernels built for a portable
# level and torch's plainest SIMD code (scripts/test_matrix.sh --quick; docs/testing.md).
# Arguments go to pytest instead of the whole suite and the matrix:
# `bash scripts/test.sh tests/nn/test_gen_max.py -x`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PY="${REVGNN_VENV:-.venv}/bin/python"
"$PY" -m ruff format --check --quiet . || { echo "ruff format: run '$PY -m ruff format .'"; exit 1; }
"$PY" -m ruff check --quiet .
bash scripts/docs.sh  # the documentation site (warnings are errors) and the docstring examples
if [ $# -gt 0 ]; then
  exec "$PY" -m pytest "$@"
fi
"$PY" -m pytest tests
bash scripts/test_matrix.sh --quick x86-64-v2:default
