"""A data set is its loader plus one YAML file: the ``data`` schemas derive from the loaders' signatures
(:func:`revgnn.config.data_options.data_schema`), the OGB node data sets from one spec each
(``OGBN_SPECS``)."""

import dataclasses
import importlib
import inspect
import sys
import textwrap

import pytest
from omegaconf import OmegaConf
from omegaconf.errors import ConfigAttributeError, ValidationError

import revgnn.config as config
from revgnn.utils.ranges import Range

DATA_DIR = config.DATA_CONFIGS
DATA_OPTIONS = sorted(p.stem for p in DATA_DIR.glob("*.yaml"))


def _loader(target):
    module, _, name = target.rpartition(".")
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("option", DATA_OPTIONS)
def test_every_data_option_selects_the_schema_of_its_loader(option):
    raw = OmegaConf.load(DATA_DIR / f"{option}.yaml")
    loader = _loader(raw._target_)
    assert {"/schema/data@_here_": loader.__name__} in raw.defaults
    schema = config.data_schemas()[loader.__name__]
    fields = {f.name: f for f in dataclasses.fields(schema)}
    params = inspect.signature(loader).parameters
    assert set(fields) == {"_target_", *params}
    for name, p in params.items():
        assert fields[name].default == ("???" if p.default is p.empty else p.default), name


def test_schema_keeps_types_defaults_and_ranges():
    from revgnn.data.synthetic import proteins_like

    cfg = OmegaConf.structured(config.data_schema("revgnn.data.synthetic.proteins_like"))
    assert cfg._target_ == "revgnn.data.synthetic.proteins_like"
    assert cfg.num_nodes == inspect.signature(proteins_like).parameters["num_nodes"].default
    with pytest.raises(ConfigAttributeError, match="num_nodse"):
        cfg.num_nodse = 10
    with pytest.raises(ValidationError, match="seed"):
        cfg.seed = "one"
    cfg.num_nodes = 0
    with pytest.raises(ValueError, match=r"^data\.num_nodes must be >= 1, got 0$"):
        config.check_ranges(OmegaConf.create({"data": cfg}))
    cfg.num_nodes, cfg.edge_noise = 10, -0.5
    with pytest.raises(ValueError, match=r"^data\.edge_noise must be >= 0, got -0.5$"):
        config.check_ranges(OmegaConf.create({"data": cfg}))


def test_range_contains_and_describes():
    half_open = Range(0, 1, high_open=True)
    assert half_open.contains(0) and half_open.contains(0.5) and not half_open.contains(1)
    assert half_open.contains(None) and not half_open.contains(-1e-9)
    assert half_open.describe() == ">= 0 and < 1" and repr(Range(low=2, low_open=True)) == "Range(> 2)"


def _new_loader(tmp_path, monkeypatch, body):
    (tmp_path / "my_loaders.py").write_text(textwrap.dedent(body))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("my_loaders", None)
    configs = tmp_path / "data"
    configs.mkdir()
    return configs


def test_a_new_data_set_is_a_loader_and_a_yaml(tmp_path, monkeypatch):
    configs = _new_loader(
        tmp_path,
        monkeypatch,
        """
        from typing import Annotated, Optional
        from revgnn.utils.ranges import Range

        def rings(num_rings: Annotated[int, Range(1)] = 4, name: str = "r", scale: Optional[float] = None):
            return num_rings, name, scale
        """,
    )
    (configs / "rings.yaml").write_text(
        "defaults:\n  - /schema/data@_here_: rings\n  - _self_\n\n_target_: my_loaders.rings\nnum_rings: 3\n"
    )
    (schema,) = config.data_schemas(configs).values()
    cfg = OmegaConf.merge(OmegaConf.structured(schema), {"num_rings": 3})
    assert (cfg.num_rings, cfg.name, cfg.scale) == (3, "r", None)
    with pytest.raises(ValidationError, match="num_rings"):
        cfg.num_rings = "three"
    from hydra.utils import instantiate

    assert instantiate(cfg) == (3, "r", None)


@pytest.mark.parametrize(
    "body,match",
    [
        ("def rings(num_rings=4):\n    pass\n", "'num_rings' has no type annotation"),
        ("def rings(*sizes: int):\n    pass\n", "'sizes' is variadic positional"),
        ("import torch\ndef rings(t: torch.Tensor = None):\n    pass\n", "cannot be a config schema"),
    ],
)
def test_a_loader_signature_a_config_cannot_hold_is_a_clear_error(tmp_path, monkeypatch, body, match):
    _new_loader(tmp_path, monkeypatch, body)
    with pytest.raises(TypeError, match=match):
        config.data_schema("my_loaders.rings")


def test_data_yaml_without_target_or_with_a_clashing_name_is_an_error(tmp_path, monkeypatch):
    configs = _new_loader(tmp_path, monkeypatch, "def proteins_like(n: int = 1):\n    pass\n")
    (configs / "a.yaml").write_text("_target_: my_loaders.proteins_like\n")
    (configs / "b.yaml").write_text("_target_: revgnn.data.synthetic.proteins_like\n")
    with pytest.raises(ValueError, match="two data loaders are named 'proteins_like'"):
        config.data_schemas(configs)
    (configs / "b.yaml").unlink()
    (configs / "c.yaml").write_text("num_nodes: 3\n")
    with pytest.raises(ValueError, match=r"c\.yaml names no _target_"):
        config.data_schemas(configs)
    with pytest.raises(ImportError, match="no_such_module"):
        config.data_schema("no_such_module.loader")


@pytest.mark.parametrize("option", DATA_OPTIONS)
def test_a_composed_data_config_pickles(option):
    """Worker processes (DDP, SAR, run_workers) receive the composed config pickled: the derived
    schema must be importable by name."""
    import pickle

    from conftest import compose

    cfg = compose([f"data={option}"])
    again = pickle.loads(pickle.dumps(cfg))
    assert again == cfg and OmegaConf.get_type(again.data) is OmegaConf.get_type(cfg.data)
