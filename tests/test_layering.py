"""The package's layering (docs/layout.md): no import circle between revgnn's modules, and every
function short enough to read (issue 25's bounds)."""

import ast

from conftest import REPO

PACKAGE = REPO / "revgnn"
MAX_FUNCTION_LINES = 120


def _modules():
    mods = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = path
    return mods


def _absolute(node: ast.ImportFrom, package: str) -> str:
    """The module a ``from ... import`` names, made absolute against ``package``."""
    if not node.level:
        return node.module or ""
    up = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join(up + ([node.module] if node.module else []))


def _imports(mods):
    """``(module, imported names)`` for every import statement of every module, top level or inside
    functions: ``import a.b`` names ``a.b``; ``from m import x`` names ``m.x`` where that is a module
    (a submodule of the package ``m``), else ``m``; relative imports made absolute."""
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                yield mod, [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(node, package)
                yield mod, [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]


def _import_graph():
    """Module -> the revgnn modules it imports anywhere."""
    mods = _modules()

    def owner(name):  # the module an imported name lives in
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name

    graph = {m: set() for m in mods}
    for mod, names in _imports(mods):
        graph[mod] |= {owner(n) for n in names if n.startswith("revgnn")} - {mod, ""}
    return graph


def _cycles(graph):
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_every_import_of_revgnn_names_a_module_that_exists():
    """A moved module leaves no import of its old name behind (absolute or relative): every module an
    import statement names exists."""
    mods = _modules()
    missing = [
        f"{mod} imports {n}"
        for mod, names in _imports(mods)
        for n in names
        if n.startswith("revgnn") and n not in mods
    ]
    assert missing == []


def test_no_import_circle():
    """A module never imports, even inside a function, a module that imports it back (directly or
    through others, a package's __init__ included): every import runs down a layer."""
    assert _cycles(_import_graph()) == []


def test_the_cycle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_function_over_the_line_bound():
    long = [
        f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert long == []


def test_the_library_imports_no_hydra():
    """The models, blocks, solvers and data (what users import into their own code) load no Hydra or
    OmegaConf module: the config layer builds Hydra's nodes from their registries, not the other way
    round. A fresh interpreter, so that nothing imported earlier in the test session counts."""
    import subprocess
    import sys

    code = (
        "import sys, revgnn.models, revgnn.nn, revgnn.deq, revgnn.data, revgnn.errors\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('hydra', 'omegaconf')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
