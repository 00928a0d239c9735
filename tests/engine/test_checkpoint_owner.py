"""revgnn/engine/checkpoint.py is the one module that knows the checkpoint's entries (issue 25): every
other module of revgnn/ and benchmarks/ that reads a checkpoint gets it from ``load_checkpoint`` and
hands it on (to ``restore``) or goes through ``load_trained``, without indexing it by an entry's name."""

import ast

from conftest import REPO

from revgnn.engine.checkpoint import CHECKPOINT_KEYS

OWNER = REPO / "revgnn" / "engine" / "checkpoint.py"


def _entry_reads(tree: ast.AST):
    """``(line, entry)`` for every ``x[<entry>]`` / ``x.get(<entry>)`` whose ``x`` was assigned from a
    ``load_checkpoint(...)`` call in the same file."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            func = node.value.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if called == "load_checkpoint":
                names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id in names:
            key = node.slice
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id in names
            and node.args
        ):
            key = node.args[0]
        if isinstance(key, ast.Constant) and key.value in CHECKPOINT_KEYS:
            yield node.lineno, key.value


def _files():
    for root in ("revgnn", "benchmarks", "scripts"):
        for path in sorted((REPO / root).rglob("*.py")):
            if path != OWNER:
                yield path


def test_only_checkpoint_py_reads_the_checkpoint_entries():
    found = [
        f"{path.relative_to(REPO)}:{line} reads ckpt[{key!r}]"
        for path in _files()
        for line, key in _entry_reads(ast.parse(path.read_text()))
    ]
    assert not found, "read it through revgnn.engine.checkpoint (load_trained, restore):\n" + "\n".join(found)


def test_the_scan_finds_an_entry_read():
    src = "c = load_checkpoint(p)\nm = c['model']\nh = c.get('history')\nk = c[other]\n"
    assert list(_entry_reads(ast.parse(src))) == [(2, "model"), (3, "history")]
