#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh) and runs the test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec "${REVGNN_VENV:-.venv}/bin/python" -m pytest tests "$@"
