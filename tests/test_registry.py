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
