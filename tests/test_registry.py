"""The one registry helper (revgnn.utils.registry): register, get with close-match hints, list."""

import pytest

from revgnn.utils.registry import Registry, UnknownName


def _registry():
    checked = []

    def entry(name, obj):
        if not callable(obj):
            raise TypeError(f"{name!r} must be callable")
        checked.append(name)
        return ("entry", obj)

    return Registry("widget", entry, how_to_add="add yours with WIDGETS.register"), checked


def test_register_get_and_list():
    reg, checked = _registry()

    @reg.register("alpha")
    def a():
        pass

    assert reg.register("beta", len) is len  # a call as well as a decorator; returns the object
    reg.register()(sorted)  # the object's own name
    assert reg.names() == ["alpha", "beta", "sorted"] == list(reg) and len(reg) == 3
    assert reg.names("b*") == ["beta"] and reg.get("alpha") == ("entry", a) == reg["alpha"]
    assert checked == ["alpha", "beta", "sorted"] and "beta" in reg and "gamma" not in reg
    assert [] not in reg  # an unhashable value is no name, not a crash
    assert reg.unregister("beta") == ("entry", len) and reg.names() == ["alpha", "sorted"]


def test_unknown_names_list_the_closest_and_all():
    reg, _ = _registry()
    reg.register("alpha", min)
    reg.register("alphabet", max)
    with pytest.raises(UnknownName) as err:
        reg.get("alpah")
    assert str(err.value) == (
        "unknown widget 'alpah' (did you mean 'alpha', 'alphabet'?); choose one of alpha, alphabet "
        "(add yours with WIDGETS.register)"
    )
    assert isinstance(err.value, KeyError) and isinstance(err.value, ValueError)
    assert str(reg.unknown("zzz", prefix="model.conv: ")).startswith("model.conv: unknown widget 'zzz'; ")
    with pytest.raises(UnknownName, match="unknown widget 'x'"):
        reg.unregister("x")


def test_taken_names_bad_names_and_failed_checks_register_nothing():
    reg, _ = _registry()
    reg.register("alpha", min)
    reg.register("alpha", min)  # the same object again (a module re-imported) is no clash
    with pytest.raises(ValueError, match=r"widget named 'alpha' is already registered \(builtins\.min\); "):
        reg.register("alpha", max)
    with pytest.raises(ValueError, match="non-empty string"):
        reg.register("", max)
    with pytest.raises(TypeError, match="'three' must be callable"):
        reg.register("three", 3)
    assert reg.names() == ["alpha"] and reg.get("alpha") == ("entry", min)
    with pytest.raises(TypeError):
        reg["beta"] = max  # read-only: every entry goes through register and its checks


def _imports_below(path, module):
    """Every module ``path`` imports (at the top or inside functions) that lies under ``module``."""
    import ast
    from pathlib import Path

    tree = ast.parse(Path(path).read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    return [n for n in names if n == module or n.startswith(module + ".")]


def test_no_registry_imports_what_registers_into_it():
    """The registries do not import the modules that register the built-ins (the circles
    blocks <-> conv_registry and backends <-> sar): the packages' ``__init__`` do."""
    from conftest import REPO

    assert _imports_below(REPO / "revgnn/nn/conv_registry.py", "revgnn.nn.blocks") == []
    assert _imports_below(REPO / "revgnn/engine/backends.py", "revgnn.engine.sar") == []


def test_backends_by_name_and_unknown_names_are_config_errors():
    from conftest import compose

    from revgnn.config import ConfigError
    from revgnn.engine.backends import BACKENDS, LocalBackend, make_backend
    from revgnn.engine.sar import SARBackend

    assert BACKENDS.names() == ["ddp", "local", "sar"] and BACKENDS.get("sar") is SARBackend
    assert type(make_backend(compose([]))) is LocalBackend and SARBackend.name == "sar"
    with pytest.raises(ConfigError, match=r"^backend\.name: unknown backend 'lcal' \(did you mean 'local'"):
        make_backend(compose(["backend.name=lcal"]))


def test_a_user_module_in_imports_registers_a_backend(tmp_path, monkeypatch):
    """``imports=[my_pkg.mod]`` imports a user's module before anything is built, so that what it
    registers can be named in the config; a module that is not there is an error naming it."""
    import sys
    import textwrap

    from conftest import compose

    from revgnn.config import ConfigError, import_modules
    from revgnn.engine.backends import BACKENDS, make_backend

    (tmp_path / "my_backends.py").write_text(
        textwrap.dedent(
            """
            from revgnn.engine.backends import LocalBackend, register_backend

            @register_backend("mine")
            class MyBackend(LocalBackend):
                pass
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = compose(["imports=[my_backends]", "backend.name=mine"])
    try:
        import_modules(cfg.imports)
        backend = make_backend(cfg)
        assert type(backend).__name__ == "MyBackend" and backend.identity()["backend"] == "mine"
    finally:
        if "mine" in BACKENDS:
            BACKENDS.unregister("mine")
        sys.modules.pop("my_backends", None)
    with pytest.raises(ConfigError, match=r"^imports\[1\]=no_such_mod: no module named 'no_such_mod'"):
        import_modules(["json", "no_such_mod"])
