"""``python -m benchmarks.deq <benchmark> [options]``: runs ``benchmarks.deq.<module>.main`` with the
options (``python -m benchmarks.deq <benchmark> --help`` lists them)."""

from __future__ import annotations

import importlib
import sys

#: The benchmarks by the name the command line gives them -> their module in this package.
BENCHMARKS = {
    "solvers": "solvers",
    "step": "step",
    "peer": "peer",
    "broyden-memory": "broyden_memory",
    "train": "train",
    "jacobian": "jacobian",
}


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    usage = f"usage: python -m benchmarks.deq {{{','.join(BENCHMARKS)}}} [options]"
    if argv and argv[0] in ("-h", "--help"):
        doc = importlib.import_module("benchmarks.deq").__doc__
        print(f"{usage}\n\n{doc}")
        return
    if not argv or argv[0] not in BENCHMARKS:
        given = f"no DEQ benchmark {argv[0]!r}" if argv else "no benchmark named"
        raise SystemExit(f"{usage}\n{given}: choose one of {', '.join(BENCHMARKS)}")
    module = importlib.import_module(f"benchmarks.deq.{BENCHMARKS[argv[0]]}")
    module.main(argv[1:], prog=f"python -m benchmarks.deq {argv[0]}")


if __name__ == "__main__":
    main()
