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

from revgnn.config.data_options import DATA_CONFIGS, data_schema, data_schemas
from revgnn.config.schema import (
    AdamConfig,
    BackendConfig,
    Device,
    DistBackend,
    LoggerConfig,
    ModelConfig,
    PartitionMode,
    Precision,
    TrainConfig,
    TrainerConfig,
    check_keys,
    check_ranges,
    ranged,
)
from revgnn.config.store import (
    builtin_model_names,
    import_modules,
    register_configs,
    register_data_dir,
    store_data_schema,
    store_model_config,
)

__all__ = [
    "TrainConfig",
    "TrainerConfig",
    "LoggerConfig",
    "BackendConfig",
    "ModelConfig",
    "AdamConfig",
    "Device",
    "Precision",
    "DistBackend",
    "PartitionMode",
    "ranged",
    "check_keys",
    "check_ranges",
    "DATA_CONFIGS",
    "data_schema",
    "data_schemas",
    "register_configs",
    "store_model_config",
    "builtin_model_names",
    "register_data_dir",
    "store_data_schema",
    "import_modules",
]
