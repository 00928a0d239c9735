"""Hydra configuration files of revgnn-train (a package so that Hydra finds them as ``pkg://revgnn.configs``)."""
