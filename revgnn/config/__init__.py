"""The configuration layer of ``revgnn-train``, one module per job:

* :mod:`~revgnn.config.schema`: the typed schemas of ``train.yaml`` and its groups, and the checks that
  read them (unknown keys, ranges);
* :mod:`~revgnn.config.data_options`: a ``data`` option's schema, derived from its loader's signature;
* :mod:`~revgnn.config.store`: Hydra's config nodes built from the schemas and the registries
  (:func:`~revgnn.config.store.register_configs`; nothing is stored at import).

What only the command line needs (run directories, launchers, override quoting, the exit of a refused
run) is in :mod:`revgnn.cli`. The library below this layer (models, blocks, solvers, data) imports no
Hydra; this package is where the Hydra boundary starts.
"""

# each name is listed once, in its home module's __all__
from revgnn.config import data_options, schema, store
from revgnn.config.data_options import *  # noqa: F403
from revgnn.config.schema import *  # noqa: F403
from revgnn.config.store import *  # noqa: F403

__all__ = [*schema.__all__, *data_options.__all__, *store.__all__]
