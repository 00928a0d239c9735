"""Console scripts besides ``revgnn-train``: ``revgnn-evaluate`` (:mod:`revgnn.cli.evaluate`) and
``revgnn-reproduce`` (:mod:`revgnn.cli.reproduce`). They ship in the wheel, so every command of the
README works from ``pip install .``."""
