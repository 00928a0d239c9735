"""The benchmarks run on revgnn's public API (issue 25): no module under ``benchmarks/`` imports, or
reaches through an imported module for, a private name (a leading underscore) of ``revgnn``, nor
calls a private method of a revgnn class. What a
benchmark needs from revgnn that was private is made public there, with a docstring, so that a change
to revgnn's internals cannot silently change a published figure."""

import ast

from conftest import REPO


def _dotted(node):
    """``a.b.c`` for a chain of attributes on a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


def _private(dotted: str) -> bool:
    return any(p.startswith("_") and not (p.startswith("__") and p.endswith("__")) for p in dotted.split("."))


def private_revgnn_names(source: str):
    """The private revgnn names ``source`` uses: ``from revgnn.x import _y``, ``import revgnn._x``,
    ``from revgnn._x import y``, and ``m._y`` (or ``revgnn.x._y``) on a name bound to a revgnn module or
    object by an import. Returns ``(line, dotted name)`` for each."""
    tree = ast.parse(source)
    bound = {}  # local name -> the revgnn name it was imported as
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "revgnn":
                    if _private(a.name):
                        found.append((node.lineno, a.name))
                    bound[a.asname or a.name.split(".")[0]] = a.name if a.asname else "revgnn"
        elif (
            isinstance(node, ast.ImportFrom)
            and not node.level
            and (node.module or "").split(".")[0] == "revgnn"
        ):
            for a in node.names:
                full = f"{node.module}.{a.name}"
                if _private(full):
                    found.append((node.lineno, full))
                bound[a.asname or a.name] = full
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}  # a.b of a.b.c: seen whole
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in inner:
            dotted = _dotted(node)
            if dotted and dotted.split(".")[0] in bound:
                full = ".".join([bound[dotted.split(".")[0]], *dotted.split(".")[1:]])
                if _private(full) and (node.lineno, full) not in found:
                    found.append((node.lineno, full))
    return found


def private_members(tree) -> set:
    """The private (leading underscore, not dunder) methods and attributes a module's classes define:
    ``def _x`` in a class body and ``self._x = ...`` anywhere."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            names |= {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            if isinstance(node.value, ast.Name) and node.value.id == "self":
                names.add(node.attr)
    return {n for n in names if _private(n)}


def private_member_uses(source: str, revgnn_private: set):
    """``(line, name)`` for every ``obj._x`` in ``source`` where ``_x`` is a private member of a revgnn
    class (:func:`private_members` of the package) that ``source`` does not define itself: an object of
    revgnn reached into (the object's type is not known statically, so the name decides)."""
    tree = ast.parse(source)
    own = private_members(tree)
    return [
        (node.lineno, node.attr)
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr in revgnn_private - own
    ]


def test_the_scan_finds_each_way_of_reaching_a_private_name():
    source = "\n".join(
        [
            "from revgnn.deq.regularize import _power_iteration, spectral_radius",
            "from revgnn.deq import (\n    get_solver,\n    _hidden as h,\n)",
            "import revgnn._private",
            "from revgnn._private import public_there",
            "import revgnn.deq.regularize as reg",
            "import revgnn",
            "def f():",
            "    return reg._tail_mean([0.0]), revgnn.deq._solve, reg.spectral_radius",
            "from torch import _C",  # not revgnn's
            "import benchmarks.common as common",
            "common._helper",
            "reg._a._b",
        ]
    )
    names = sorted(name for _, name in private_revgnn_names(source))
    assert names == sorted(
        [
            "revgnn.deq.regularize._power_iteration",
            "revgnn.deq._hidden",
            "revgnn._private",
            "revgnn._private.public_there",
            "revgnn.deq.regularize._tail_mean",
            "revgnn.deq._solve",
            "revgnn.deq.regularize._a._b",
        ]
    ), names
    assert private_revgnn_names("from revgnn.deq import power_iteration\nimport revgnn.deq as d\nd.DEQ") == []


def test_the_member_scan_finds_a_private_method_of_a_revgnn_class():
    revgnn = private_members(
        ast.parse("class G:\n    def _tag(self):\n        self._n = 1\n    def ok(self): pass")
    )
    assert revgnn == {"_tag", "_n"}
    source = "def f(g):\n    return g._tag(), g.ok(), g._n\nclass Mine:\n    def _n(self): pass"
    assert private_member_uses(source, revgnn) == [(2, "_tag")]  # _n is the benchmark's own


def test_no_benchmark_uses_a_private_revgnn_name():
    paths = sorted((REPO / "benchmarks").rglob("*.py"))
    assert len(paths) > 10  # the package, not an empty glob
    revgnn_private = set().union(
        *(private_members(ast.parse(p.read_text())) for p in (REPO / "revgnn").rglob("*.py"))
    )
    assert {"_power_iteration", "_vjp"} & revgnn_private == set()  # module functions: the import scan's
    assert "_counter" in revgnn_private  # SARGraph's, e.g.
    offenders = [
        f"{path.relative_to(REPO)}:{line}: {name}"
        for path in paths
        for line, name in [
            *private_revgnn_names(path.read_text()),
            *private_member_uses(path.read_text(), revgnn_private),
        ]
    ]
    assert not offenders, (
        "benchmarks use private revgnn names; make each public in revgnn (documented, exported) or compute "
        "it from public APIs:\n" + "\n".join(offenders)
    )
