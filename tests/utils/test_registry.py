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
    assert _imports_below(REPO / "revgnn/engine/backends.py", "revgnn.engine.sar_backend") == []


def test_backends_by_name_and_unknown_names_are_config_errors():
    from conftest import compose

    from revgnn.engine.backends import BACKENDS, LocalBackend, make_backend
    from revgnn.engine.sar_backend import SARBackend
    from revgnn.errors import ConfigError

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

    from revgnn.config.store import import_modules
    from revgnn.engine.backends import BACKENDS, make_backend
    from revgnn.errors import ConfigError

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


USER_MODULE = '''
from revgnn.deq import fixed_point, register_solver
from revgnn.models import RevGNN, register_model
from revgnn.models.paper import PROTEINS
from revgnn.nn import PreActBlock, register_conv
from torch_geometric.nn import GraphConv


@register_conv("user_graph")
class UserGraphBlock(PreActBlock):
    def __init__(self, channels, aggr="add", norm="layer", preact=True):
        super().__init__(channels, norm, preact)
        self.conv = GraphConv(channels, channels, aggr=aggr)

    def conv_forward(self, h, edge_index, edge_attr):
        return self.conv(h, edge_index)


@register_model(RevGNN, dataset="proteins_like", num_parameters=0)
def user_revgnn():
    """A user's variant."""
    return dict(PROTEINS, num_layers=2, hidden_channels=8, conv="user_graph")


def user_solver(f, z0, *, max_iter=50, tol=1e-4, stop_mode="rel"):
    return fixed_point(f, z0, max_iter=max_iter, tol=tol, stop_mode=stop_mode)


register_solver("user_solver", user_solver)
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A user's module, ``user_zoo``, registering a conv, a model variant and a DEQ solver; the
    registrations are undone afterwards."""
    import sys

    from revgnn.deq import SOLVERS
    from revgnn.models.registry import MODELS
    from revgnn.nn import CONVS

    (tmp_path / "user_zoo.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "user_zoo"
    for registry, name in ((MODELS, "user_revgnn"), (CONVS, "user_graph"), (SOLVERS, "user_solver")):
        if name in registry:
            registry.unregister(name)
    sys.modules.pop("user_zoo", None)


def test_a_user_module_in_imports_registers_a_model_a_conv_and_a_solver(user_module):
    from conftest import compose

    from revgnn.config.store import import_modules
    from revgnn.engine.loop import build_model
    from revgnn.models import check_model_config
    from revgnn.models.paper import PROTEINS

    cfg = compose([f"imports=[{user_module}]", "model.name=user_revgnn", "model.aggr=mean"])
    import_modules(cfg.imports)
    check_model_config(cfg.model)
    model = build_model(cfg.model, PROTEINS)
    assert type(model.layers[0].convs[0]).__name__ == "UserGraphBlock"
    assert model.layers[0].convs[0].conv.aggr == "mean"
    assert "user_revgnn" in {n.removesuffix(".yaml") for n in _stored_models()}  # model=user_revgnn too
    cfg = compose(["model=deq_gnn", "model.solver=user_solver"])
    check_model_config(cfg.model)
    assert build_model(cfg.model, PROTEINS).deq.solver == "user_solver"


def _stored_models():
    from hydra.core.config_store import ConfigStore

    return ConfigStore.instance().list("model")


def test_revgnn_train_imports_a_user_module_from_the_working_directory(tmp_path):
    """The whole command: ``revgnn-train imports=[user_zoo] model.name=user_revgnn`` trains the
    user's variant, with its conv and that conv's own option, from a module in the working directory."""
    import json

    from conftest import TINY_RUN, run_cli

    (tmp_path / "user_zoo.py").write_text(USER_MODULE)
    overrides = [o for o in TINY_RUN if not o.startswith("model.")]
    user = ["imports=[user_zoo]", "model.name=user_revgnn", "model.aggr=mean"]
    run_cli(
        "-m", "revgnn.train", *user, *overrides, f"output_dir={tmp_path / 'run'}", cwd=tmp_path, timeout=600
    )
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "completed", summary
    log = (tmp_path / "run" / ".hydra" / "config.yaml").read_text()
    assert "user_revgnn" in log and "imports:\n- user_zoo" in log
