"""revgnn's benchmarks, one module each, run from the repository root (not part of the installed
package): ``python -m benchmarks.step --model revgnn_deep --num-layers 20``. They use revgnn's public
API and :mod:`benchmarks.common`; their tables live in ``docs/bench/`` with the command that made them.

Child processes a benchmark starts (``python -m benchmarks.<name> --child ...``) find this package
through ``PYTHONPATH``, set here to the repository root whatever their working directory."""

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
