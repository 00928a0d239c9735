"""revgnn.utils.signature: a parameter's annotation is the one statement of its type, choices and
range, read the same way by the checks made before anything is built and by the callee itself."""

from typing import Annotated, Literal, Optional

import pytest

from revgnn.utils.ranges import Range
from revgnn.utils.registry import Registry
from revgnn.utils.signature import check_arguments, check_call, expected, with_defaults

WIDGETS = Registry("widget", how_to_add="add your own with WIDGETS.register")
WIDGETS.register("knob", object())


def layer(
    channels: Annotated[int, Range(1)],
    dropout: Annotated[float, Range(0, 1, high_open=True)] = 0.0,
    depth: Annotated[Optional[int], Range(1)] = None,
    mode: Literal["a", "b"] = "a",
    widget: Annotated[str, WIDGETS] = "knob",
    **options,
):
    check_call(layer, locals())
    return channels


def test_expected_reads_the_range_after_the_type():
    annotation = Annotated[float, Range(0, 1, high_open=True)]
    assert expected(0.0, annotation) is None and expected(0, annotation) is None
    assert expected(1.0, annotation) == ">= 0 and < 1"
    assert expected(-0.5, annotation) == ">= 0 and < 1"
    assert expected("x", annotation) == "a number"  # the type first: no range of a string
    assert expected(None, Annotated[Optional[int], Range(1)]) is None
    assert expected(0, Annotated[Optional[int], Range(1)]) == ">= 1"
    assert expected(True, Annotated[int, Range(0)]) == "an int"  # a bool is no int here


def test_check_call_checks_a_callee_s_own_arguments():
    assert layer(4, dropout=0.5, depth=2, extra=1) == 4  # **options are the callee's to forward
    for kwargs, error, message in (
        ({"channels": 0}, ValueError, "channels must be >= 1, got 0"),
        ({"channels": 2, "dropout": 1.0}, ValueError, "dropout must be >= 0 and < 1, got 1.0"),
        ({"channels": 2, "depth": 0}, ValueError, "depth must be >= 1, got 0"),
        ({"channels": 2, "mode": "c"}, ValueError, "mode must be one of 'a', 'b', got 'c'"),
        ({"channels": "2"}, TypeError, "channels must be an int, got '2'"),
        (
            {"channels": 2, "widget": "knb"},
            ValueError,
            "widget must be one of the registered widgets knob (did you mean 'knob'?; add your own with "
            "WIDGETS.register), got 'knb'",
        ),
    ):
        with pytest.raises(error) as err:
            layer(**kwargs)
        assert str(err.value) == message


def test_check_arguments_names_the_key_with_its_prefix():
    with pytest.raises(ValueError, match=r"^model\.dropout must be >= 0 and < 1, got 2$"):
        check_arguments(layer, {"dropout": 2}, what="the layer", prefix="model.")
    with pytest.raises(TypeError, match=r"the layer has no option\(s\) model\.dropot \(did you mean"):
        check_arguments(layer, {"dropot": 0.1}, what="the layer", prefix="model.")


def test_with_defaults_fills_what_was_not_given():
    assert with_defaults(layer, {"channels": 3, "heads": 2}) == {
        "dropout": 0.0,
        "depth": None,
        "mode": "a",
        "widget": "knob",
        "channels": 3,
        "heads": 2,
    }
