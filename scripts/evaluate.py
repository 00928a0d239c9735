"""Deprecated: the console script ``revgnn-evaluate`` (:mod:`revgnn.cli.evaluate`) takes the same options."""
import sys

from revgnn.cli.evaluate import main

if __name__ == "__main__":
    print("scripts/evaluate.py is deprecated: use revgnn-evaluate (same options)", file=sys.stderr)
    main()
