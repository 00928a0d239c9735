"""Every name a lazily importing package lists resolves, and nothing else does."""

import importlib

import pytest


@pytest.mark.parametrize("package", ["revgnn.data", "revgnn.utils", "revgnn.distributed"])
def test_every_listed_name_resolves_to_its_home(package):
    pkg = importlib.import_module(package)
    for name in pkg.__all__:
        value = getattr(pkg, name)
        assert getattr(value, "__name__", name) == name or not callable(value), (package, name)
    with pytest.raises(AttributeError, match=f"module '{package}' has no attribute 'no_such_name'"):
        pkg.no_such_name  # noqa: B018
