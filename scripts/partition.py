#!/usr/bin/env python
"""Partition a data set for SAR: one file per worker plus meta.json.

    python scripts/partition.py --data proteins_like --num-parts 4 --out parts/pl4
    python scripts/partition.py --data ogbn-proteins --root data --num-parts 8 \\
        --method metis --out parts/proteins8

Same as the ``revgnn-partition`` command. Then:
    torchrun --nproc_per_node=4 -m revgnn.distributed.run --partition-dir parts/pl4
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))

from revgnn.distributed.partition import main  # noqa: E402

if __name__ == '__main__':
    sys.exit(main())
