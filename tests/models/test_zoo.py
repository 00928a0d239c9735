"""One source of truth per model variant: the registry's metadata against the built models, the
model configs, the experiments, the README's zoo table and ``revgnn-reproduce``'s paper row.

Models are built on the ``meta`` device (shapes, no storage), so the 1001-layer and 448 x 224
variants are counted exactly without allocating their weights.
"""

import re

import pytest
import torch
from conftest import REPO, compose, run_cli
from omegaconf import OmegaConf
from zoo_cases import ZOO

from revgnn.config.store import builtin_model_names
from revgnn.engine.loop import build_model
from revgnn.errors import ConfigError
from revgnn.models import count_parameters, create_model, model_info
from revgnn.models.registry import (
    SHAPE_ARGUMENTS,
    check_model_config,
    paper_result,
    readme_zoo,
    zoo_table,
)

CONFIG_DIR = REPO / "revgnn" / "configs"
README = REPO / "README.md"
EXPERIMENTS = sorted(p.stem for p in (CONFIG_DIR / "experiment").glob("*.yaml"))

_built = {}


def _meta(name, **overrides):
    """``create_model(name, **overrides)`` on the meta device, built once per test session."""
    key = (name, tuple(sorted(overrides.items())))
    if key not in _built:
        with torch.device("meta"):
            _built[key] = create_model(name, **overrides)
    return _built[key]


def _state_shapes(model):
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def test_readme_zoo_table_is_the_registry_s():
    assert readme_zoo(README.read_text()) == zoo_table(), (
        "README zoo table is stale: python -m revgnn.models --update-readme README.md"
    )


def test_update_readme_writes_the_table_between_the_markers(tmp_path, capsys):
    from revgnn.models.__main__ import main

    readme = tmp_path / "README.md"
    readme.write_text("# x\n\n<!-- zoo:begin -->\n| stale |\n<!-- zoo:end -->\n\nafter\n")
    assert main(["--update-readme", str(readme)]) == 0 and "updated" in capsys.readouterr().out
    text = readme.read_text()
    assert readme_zoo(text) == zoo_table() and text.startswith("# x\n") and text.endswith("\n\nafter\n")
    assert main(["--update-readme", str(readme)]) == 0 and "already up to date" in capsys.readouterr().out
    assert main(["--markdown"]) == 0 and capsys.readouterr().out == zoo_table()
    readme.write_text("no markers\n")
    with pytest.raises(ValueError, match="no <!-- zoo:begin --> ... <!-- zoo:end --> block"):
        main(["--update-readme", str(readme)])


@pytest.mark.parametrize("name", ZOO)
def test_registered_parameter_counts_are_exact(name):
    info = model_info(name)
    model = _meta(name)
    assert type(model) is info.cls
    assert count_parameters(model) == info.num_parameters, name
    for result in info.reported:
        if result.overrides:
            got = count_parameters(_meta(name, **result.overrides))
            assert got == result.num_parameters, (name, result.label)


def test_every_registered_model_is_a_model_option_and_no_other():
    """The ``model=`` options are the registry's variants: read from the decorators (so that
    composing imports no torch), stored in Hydra's ConfigStore by ``register_configs``, no files."""
    from hydra.core.config_store import ConfigStore

    from revgnn.config.store import register_configs

    register_configs()
    assert builtin_model_names() == ZOO
    stored = {n.removesuffix(".yaml") for n in ConfigStore.instance().list("model")}
    assert set(ZOO) <= stored and not (CONFIG_DIR / "model").exists()


def _small(name):
    """Depth 2 where the variant has a depth: the config route and the direct one are compared
    beyond the 1001 layers, whose exact count ``test_registered_parameter_counts_are_exact`` checks."""
    info = model_info(name)
    return {"num_layers": 2} if "num_layers" in info.defaults else {}


def _shapes(name):
    info = model_info(name)
    return {k: info.defaults[k] for k in SHAPE_ARGUMENTS if k in info.defaults}


@pytest.mark.parametrize("name", ZOO)
def test_model_config_builds_the_registered_model(name):
    """``revgnn-train model=<name>`` and ``create_model(name)`` build the same model: the config holds
    the name and nothing else, and through ``build_model`` it gives the class, parameter count and
    state shapes of ``create_model``."""
    cfg = compose([f"model={name}"] + [f"model.{k}={v}" for k, v in _small(name).items()])
    assert OmegaConf.to_container(compose([f"model={name}"]).model) == {
        "_target_": "revgnn.models.create_model",
        "name": name,
    }
    check_model_config(cfg.model)
    from_config = build_model(cfg.model, _shapes(name))
    direct = create_model(name, **_small(name))
    assert type(from_config) is type(direct) is model_info(name).cls
    assert count_parameters(from_config) == count_parameters(direct)
    assert _state_shapes(from_config) == _state_shapes(direct)


def test_the_default_run_trains_its_own_registered_model():
    cfg = compose([])
    assert cfg.model.name == "revgnn_proteins_like"
    assert model_info("revgnn_proteins_like").defaults["aggr"] == "mean"
    assert model_info("revgnn_small").defaults["aggr"] == "max"


REPORTED = [(n, r) for n in ZOO for r in model_info(n).reported if r.experiment]


@pytest.mark.parametrize("name,result", REPORTED, ids=[r.experiment for _, r in REPORTED])
def test_each_experiment_trains_the_model_of_its_published_score(name, result):
    """The experiment a score names composes to that variant at the score's arguments (parameter
    count equal), and ``revgnn-reproduce`` puts that score in its paper row."""
    """The experiment a score names trains that variant at the score's arguments, and
    ``revgnn-reproduce`` puts that score in its paper row. Keys the experiment sets beyond the score's
    arguments (e.g. the official protocol's ``group_init``) must leave every state shape unchanged."""
    from revgnn.cli.reproduce import paper_score

    assert result.experiment in EXPERIMENTS
    cfg = compose([f"experiment={result.experiment}"])
    assert cfg.model.name == name
    check_model_config(cfg.model)
    info = model_info(name)
    overrides = {k: v for k, v in OmegaConf.to_container(cfg.model).items() if k not in ("_target_", "name")}
    for key, value in result.overrides.items():
        assert overrides.get(key, info.defaults.get(key)) == value, (result.experiment, key)
    extra = {k: v for k, v in overrides.items() if k not in result.overrides}
    assert not set(extra) & {"num_layers", "hidden_channels", "num_groups", *SHAPE_ARGUMENTS}, extra
    if extra:
        small = _small(name)
        with torch.device("meta"):
            experiment_model = create_model(name, **overrides, **small)
            score_model = create_model(name, **result.overrides, **small)
        assert _state_shapes(experiment_model) == _state_shapes(score_model)
    assert paper_result(result.experiment) == (info, result)
    label, reported = paper_score(result.experiment)
    assert result.label in label and reported == result


def test_reproduce_refuses_an_experiment_without_a_published_score():
    from revgnn.cli.reproduce import paper_score

    with pytest.raises(
        SystemExit, match="mol_like_revgnn.*reproduces no published score.*proteins_revgnn_deep"
    ):
        paper_score("mol_like_revgnn")


@pytest.mark.parametrize(
    "overrides",
    [
        ["model=revgnn_deep", "model.learn_t=true"],
        ["model=wt_revgnn", "model.reversible=false"],
        ["model=deq_gnn", "model.solver=broyden", "model.backward_max_iter=7"],
        ["model=revgnn_molhiv", "model.readout=attention"],
        ["experiment=proteins_wt_revgnn", "model.hidden_channels=80"],
    ],
)
def test_every_argument_of_the_model_class_can_be_overridden(overrides):
    cfg = compose(overrides)
    check_model_config(cfg.model)
    key, value = overrides[-1].split("=")
    assert str(OmegaConf.select(cfg, key)).lower() == value


@pytest.mark.parametrize(
    "override,error,message",
    [
        ("model.lern_t=true", ConfigError, r"'model\.lern_t'.*valid overrides:.*learn_t"),
        ("model.name=revgnn_dep", ValueError, r"model\.name: unknown model 'revgnn_dep'.*'revgnn_deep'"),
        ("model.dropout=1.5", ValueError, r"model\.dropout must be >= 0 and < 1, got 1\.5"),
        ("model.num_layers=0", ValueError, r"model\.num_layers must be >= 1, got 0"),
    ],
)
def test_a_wrong_model_key_is_an_error_naming_it(override, error, message):
    cfg = compose(["model=revgnn_deep", override])  # composes: the model node is open
    with pytest.raises(error, match=message):
        check_model_config(cfg.model)


def test_a_wrong_model_key_fails_the_run_before_the_data_is_loaded(monkeypatch, tmp_path):
    from revgnn.engine import loop

    def no_backend(cfg):
        raise AssertionError("the run started although the model config is wrong")

    monkeypatch.setattr(loop, "make_backend", no_backend)
    cfg = compose([f"output_dir={tmp_path}", "model.hiden_channels=16"])
    with pytest.raises(ConfigError, match=r"'model\.hiden_channels'.*hidden_channels"):
        loop.train(cfg)


@pytest.mark.parametrize(
    "override,message",
    [
        (
            "model.norm=layr",
            "model.norm must be one of 'layer', 'batch', 'graph', 'none' or null, got 'layr'",
        ),
        ("model.t=hot", "model.t must be a number, got 'hot'"),  # GENBlock's own option, forwarded
        ("model.conv=sag", "model.conv: unknown conv 'sag' (did you mean 'sage'?)"),
    ],
)
def test_model_values_are_checked_against_the_annotations(override, message):
    cfg = compose(["model=revgnn_deep", override])
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        check_model_config(cfg.model)


def test_a_bad_model_value_is_one_line_from_the_cli(tmp_path):
    """Issue 24: ``model.hidden_channels=abc`` and ``model.aggr=maxx`` failed inside torch and PyG;
    they are one line naming the key and what it must be, exit status 2, before anything starts."""
    for override, message in (
        ("model.hidden_channels=abc", "model.hidden_channels must be an int, got 'abc'"),
        (
            "model.aggr=maxx",
            "model.aggr must be one of 'max', 'softmax', 'mean', 'add', 'sum', 'powermean', ",
        ),
    ):
        text = run_cli("-m", "revgnn.train", override, f"output_dir={tmp_path / 'run'}", expect=2).output
        assert message in text, text
        assert len(text.splitlines()) <= 2 and "Traceback" not in text, text
        assert not (tmp_path / "run" / "last.pt").exists()


def test_a_range_of_a_forwarded_option_is_refused_before_the_data_loads(tmp_path):
    """Issue 34: ``model.jac_reg_weight=-1`` (a DEQ option DEQGNN forwards) passed the check before
    start and failed after the data had loaded, in ``DEQ.__init__`` (exit status 1 and Hydra's error
    text). Its range is on the DEQ's parameter now, which the check before start reads."""
    run = tmp_path / "run"
    text = run_cli(
        "-m", "revgnn.train", "model=deq_gnn_small", "model.jac_reg_weight=-1", f"output_dir={run}", expect=2
    ).output
    assert text.strip() == "revgnn-train: model.jac_reg_weight must be >= 0, got -1", text
    assert "data:" not in text and "Traceback" not in text, text  # the loop logs "data: <dataset>"
    assert not run.exists()


def _outside(bounds):
    """A value of the parameter's type just outside ``bounds``."""
    if bounds.low is not None:
        return bounds.low if bounds.low_open else bounds.low - 1
    return bounds.high if bounds.high_open else bounds.high + 1


def _ranged_parameters(name):
    """(key, Range) of every argument of the variant's class and option it forwards that declares
    a range."""
    from typing import Annotated, get_args, get_origin

    from revgnn.models.registry import forwarded_options
    from revgnn.utils.ranges import Range
    from revgnn.utils.signature import keyword_parameters

    info = model_info(name)
    forwarded, _ = forwarded_options(info.cls, info.defaults)
    params = {**(forwarded or {}), **keyword_parameters(info.cls)}
    for key, p in params.items():
        if get_origin(p.annotation) is Annotated:
            for extra in get_args(p.annotation)[1:]:
                if isinstance(extra, Range):
                    yield key, extra


@pytest.mark.parametrize(
    "name", ["revgnn_small", "resgnn_small", "revgat_arxiv", "deq_gnn_small", "mlp", "revgnn_mol_small"]
)
def test_every_declared_range_is_checked_before_start_and_by_the_constructor(name):
    """Every range a model's arguments or forwarded options declare is one check, with one message:
    the check before start refuses a value outside it naming ``model.<key>``, and the registry's
    factory and the class's constructor refuse it before any module is made."""
    ranged = dict(_ranged_parameters(name))
    assert ranged, name
    if name == "deq_gnn_small":  # the DEQ's options, forwarded, are among them
        assert {"jac_reg_weight", "tol", "max_iter", "correction_gamma"} <= set(ranged)
    for key, bounds in ranged.items():
        value = _outside(bounds)
        message = f"{key} must be {bounds.describe()}, got {value!r}"
        cfg = {"_target_": "revgnn.models.create_model", "name": name, key: value}
        with pytest.raises(ConfigError, match="^" + re.escape("model." + message) + "$"):
            check_model_config(cfg)
        with pytest.raises(ValueError, match=re.escape(f"'{name}': {message}")):
            create_model(name, **{key: value})
        info = model_info(name)  # the class itself, without the registry's check in front
        with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
            info.cls(**{**info.defaults, key: value})


@pytest.mark.parametrize(
    "overrides,message",
    [
        (
            {"name": "revgnn_small", "hidden_channels": 63},
            "model.hidden_channels=63 must be divisible by model.num_groups=2",
        ),
        (
            {"name": "revgnn_small", "conv": "gat", "heads": 3},
            "model.heads=3 must divide the width of a group, model.hidden_channels / model.num_groups = 32",
        ),
        (
            {"name": "deq_gnn_small", "solver_options": {"m": 0}},
            "model.solver_options.m must be >= 1, got 0",
        ),
        (
            {"name": "deq_gnn_small", "solver": "broyden", "solver_options": {"m": 3}},
            "unknown option(s) ['model.solver_options.m'] for solver 'broyden'",
        ),
        (
            {"name": "deq_gnn_small", "correction_states": 21},
            "model.correction_states=21 exceeds model.max_iter=20",
        ),
        (
            {"name": "deq_gnn_small", "contraction": 0.5, "aggr": "softmax"},
            "model.contraction needs model.aggr in ('max', 'mean')",
        ),
        ({"name": "revgnn_molhiv", "species_channels": 8}, "model.species_channels must be 0, got 8"),
    ],
)
def test_what_spans_several_keys_is_checked_before_start(overrides, message):
    """Constraints no single annotation states (the classes' ``check_options``) are refused by the
    check before start too, not only once the model is built."""
    cfg = {"_target_": "revgnn.models.create_model", **overrides}
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_model_config(cfg)
    name = overrides.pop("name")
    with pytest.raises((TypeError, ValueError), match=re.escape(message.replace("model.", ""))):
        create_model(name, **overrides)


def test_no_range_is_kept_apart_from_its_parameter():
    """A range is declared on the parameter (``Annotated[T, Range(...)]``), a schema field
    (``revgnn.config.schema.ranged``) or a command-line option (``revgnn.cli.ranged``), never in a table
    keyed by argument name (the former
    ``ARGUMENT_RANGES``): every ``Range(...)`` in the package's code is inside an ``Annotated[...]``."""
    import ast

    found = []
    for path in sorted((REPO / "revgnn").rglob("*.py")):
        tree = ast.parse(path.read_text())
        inside = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Subscript) and getattr(node.value, "id", None) == "Annotated":
                inside.update(id(n) for n in ast.walk(node))
        for node in ast.walk(tree):
            called = isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Range"
            if called and id(node) not in inside:
                found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    # ranged(): a schema field's range and an argparse option's, each built from its own arguments
    allowed = {"revgnn/config/schema.py", "revgnn/cli/__init__.py"}
    assert [f for f in found if f.split(":")[0] not in allowed] == []


def test_registration_checks_its_metadata():
    from revgnn.models import Reported, RevGNN, register_model
    from revgnn.models.registry import MODELS

    with pytest.raises(ValueError, match="already registered"):
        register_model(RevGNN, dataset="x", num_parameters=0, name="revgnn_deep")(dict)

    def zoo_test_typo():
        return dict(hiden_channels=3)

    with pytest.raises(TypeError, match="the defaults of 'zoo_test_typo'.*'hiden_channels'"):
        register_model(RevGNN, dataset="x", num_parameters=0)(zoo_test_typo)
    bad = Reported("X", "acc", 1.0, overrides={"hidden_channels": 8})

    def zoo_test_counts():
        return dict(in_channels=4, hidden_channels=4, out_channels=2, num_layers=1)

    with pytest.raises(ValueError, match="'zoo_test_counts'.*give its num_parameters"):
        register_model(RevGNN, dataset="x", num_parameters=0, reported=[bad])(zoo_test_counts)
    assert not {"zoo_test_typo", "zoo_test_counts"} & set(MODELS)
