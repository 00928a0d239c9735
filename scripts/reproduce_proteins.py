"""Deprecated: the console script ``revgnn-reproduce`` (:mod:`revgnn.cli.reproduce`) takes the same options."""
import sys

from revgnn.cli.reproduce import main

if __name__ == "__main__":
    print("scripts/reproduce_proteins.py is deprecated: use revgnn-reproduce (same options)", file=sys.stderr)
    main()
