"""``python -m revgnn.train`` (as ``torchrun -m revgnn.train`` starts it): the entry point of
``revgnn-train``, :mod:`revgnn.cli.train`, under its module name of the first releases."""

from revgnn.cli.train import cli

if __name__ == "__main__":
    cli()
