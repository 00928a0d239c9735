#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh), checks formatting and lint (ruff, configured in
# pyproject.toml), builds the docs and runs the docstring examples (scripts/docs.sh) and runs the
# test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PY="${REVGNN_VENV:-.venv}/bin/python"
"$PY" -m ruff format --check --quiet . || { echo "ruff format: run '$PY -m ruff format .'"; exit 1; }
"$PY" -m ruff check --quiet .
bash scripts/docs.sh  # the documentation site (warnings are errors) and the docstring examples
exec "$PY" -m pytest tests "$@"
