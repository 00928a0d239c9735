"""The errors a run refuses bad input with, in a module that imports nothing: the library (models,
blocks, data) raises them without importing the config layer or Hydra."""

from __future__ import annotations

__all__ = ["ConfigError", "ConfigTypeError"]


class ConfigError(ValueError):
    """Bad input that a run refuses before it trains: a setting, a file it names, or how it was
    launched. The message says what was wrong and what to do; ``revgnn-train`` prints it alone (no
    traceback) and exits with status 2."""


class ConfigTypeError(ConfigError, TypeError):
    """A :class:`ConfigError` that is also a :class:`TypeError`: a key that is no argument of what it
    configures (as Python says of an unexpected keyword argument)."""
