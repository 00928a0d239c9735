#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh), checks formatting and lint (ruff, configured in
# pyproject.toml) and runs the test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PY="${REVGNN_VENV:-.venv}/bin/python"
"$PY" -m ruff format --check --quiet . || { echo "ruff format: run '$PY -m ruff format .'"; exit 1; }
"$PY" -m ruff check --quiet .
exec "$PY" -m pytest tests "$@"
