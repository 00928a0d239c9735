#!/usr/bin/env bash
# Builds the documentation site (docs/ -> docs/_build/html) with every Sphinx warning an error,
# then runs the examples in the docstrings of revgnn/ and in README.md as doctests. Assumes the
# venv of scripts/setup.sh (REVGNN_VENV, default .venv; sphinx and myst-parser come with the
# dev extra). -E: a fresh environment every time, since an incremental build re-reads only changed
# pages and would not repeat the warnings of the others (nor see a changed docstring behind a summary
# table). Extra arguments go to sphinx-build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${REVGNN_VENV:-.venv}/bin/python"
rm -rf docs/api/generated  # autosummary writes these pages; a removed module must not leave its page behind
"$PY" -m sphinx -E -W --keep-going -q -b html docs docs/_build/html "$@"
"$PY" -m pytest -q -p no:cacheprovider --doctest-modules --doctest-glob="README.md" revgnn README.md
