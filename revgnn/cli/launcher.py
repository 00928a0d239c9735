"""Hydra launchers: a submitit launcher (``hydra/launcher=slurm``, ``local``) named on a command line
whose plugin is missing is refused saying how to install it (:func:`check_launcher`)."""

from __future__ import annotations

from typing import List

from revgnn.errors import ConfigError

__all__ = ["SUBMITIT_LAUNCHERS", "CLUSTER_EXTRA", "have_submitit", "check_launcher"]


#: ``hydra/launcher`` options that are Hydra's submitit plugin (revgnn's, in
#: ``configs/hydra/launcher/``, and the plugin's own).
SUBMITIT_LAUNCHERS = ("slurm", "local", "submitit_slurm", "submitit_local")
#: How to get the plugin: the ``cluster`` extra (``pyproject.toml``).
CLUSTER_EXTRA = 'pip install "revgnn[cluster]" (in a checkout: pip install ".[cluster]")'


def have_submitit() -> bool:
    """Whether Hydra's submitit launcher plugin (the ``cluster`` extra) is installed."""
    import importlib.util

    try:
        return importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is not None
    except (ImportError, ValueError):  # no hydra_plugins namespace at all
        return False


def check_launcher(overrides: List[str]) -> None:
    """Raises :class:`ConfigError` saying how to install it when ``overrides`` select a submitit
    launcher (``hydra/launcher=slurm``, ...) and the plugin is missing, where Hydra would only say
    that it cannot load ``hydra/launcher/submitit_*``."""
    for arg in overrides:
        key, _, value = arg.partition("=")
        if key.lstrip("+~") == "hydra/launcher" and value in SUBMITIT_LAUNCHERS and not have_submitit():
            raise ConfigError(
                f"hydra/launcher={value} is Hydra's submitit launcher, which is not installed: it comes "
                f"with revgnn's cluster extra, {CLUSTER_EXTRA}"
            )
