"""Sphinx configuration of the revgnn documentation (built by ``scripts/docs.sh``).

The API reference is generated from the docstrings (reST with math, Google-style ``Args:``
sections); the guides are Markdown, read by myst-parser. Nothing is fetched at build time (no
intersphinx inventories), so the site builds offline.
"""

import importlib
import inspect
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)

from sphinx.util import logging  # noqa: E402
from sphinx.util.inspect import stringify_signature  # noqa: E402

import revgnn  # noqa: E402

logger = logging.getLogger(__name__)

project = "revgnn"
author = "the revgnn authors"
copyright = "the revgnn authors"
release = version = revgnn.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "myst_parser",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
templates_path = ["_templates"]
exclude_patterns = ["_build"]

# ---- API reference ----
# One page per module (docs/api/generated/, written by autosummary at every build). Each object
# is documented once, in the module that defines it: a package's __all__ re-exports are not
# documented again on the package page (that would describe one object twice).
autosummary_generate = True
autosummary_imported_members = False
autodoc_default_options = {
    "members": True,
    "show-inheritance": True,
    "ignore-module-all": True,
    "member-order": "bysource",
}
autodoc_typehints = "description"
autoclass_content = "class"
# torch.autograd.Function.forward and friends: their docstrings describe torch, not these classes
autodoc_inherit_docstrings = False
# A reference into revgnn that does not resolve is an error (a renamed module or function left
# behind in a docstring). Other targets (torch, PyG, the types napoleon derives from "Args:") have
# no inventory offline and are not checked.
nitpicky = True
nitpick_ignore_regex = [(r"py:.*", r"(?s)(?!revgnn\.|\.).*")]
# Google-style "Args:" as in PyG: "name (type, optional): text. (default: ...)"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

# ---- Markdown guides ----
myst_enable_extensions = ["dollarmath", "colon_fence"]
myst_heading_anchors = 3

# ---- HTML ----
html_theme = "alabaster"
html_title = f"revgnn {release}"
html_static_path = []


# ---- References to re-exported names ----
def _import_dotted(name):
    """The object a dotted name refers to (longest importable module, then attributes), or None."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return None
        return obj
    return None


def _resolve_reexport(app, env, node, contnode):
    """Links a package's re-export (``revgnn.nn.GroupAddRev``) to the page of the module that defines
    the object (``revgnn.nn.group_rev.GroupAddRev``), where it is documented."""
    target = node.get("reftarget", "")
    if node.get("refdomain") != "py":
        return None
    if node.get("refspecific") and "`." in node.rawsource.replace("`~", "`"):
        # ":mod:`.sar`": relative to the current module, searched everywhere; nitpick_ignore_regex
        # sees only the bare name, so a stale one is reported here
        logger.warning("py:%s reference target not found: .%s", node["reftype"], target, location=node)
        return None
    if not target.startswith("revgnn."):
        return None
    obj = _import_dotted(target)
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not module or not qualname or f"{module}.{qualname}" == target:
        return None
    py = env.get_domain("py")
    return py.resolve_xref(
        env, node["refdoc"], app.builder, node["reftype"], f"{module}.{qualname}", node, contnode
    )


# ---- Class signatures ----
def _constructor_signature(app, what, name, obj, options, signature, return_annotation):
    """Shows a class's constructor arguments where a base class defines a generic ``__new__``.

    ``InvertibleModule.__new__(cls, *args, **kwargs)`` (it checks the subclass's contract) comes first
    in autodoc's search, which would show every invertible block as ``(*args, **kwargs)``; Python's
    own :func:`inspect.signature` takes the ``__init__`` or ``__new__`` nearest in the MRO instead.
    """
    if what != "class" or signature != "(*args, **kwargs)":
        return None
    try:
        sig = inspect.signature(obj)
        if "__new__" in vars(obj) and "__init__" in vars(obj):  # both in one class: __init__'s arguments
            init = inspect.signature(obj.__init__)
            sig = init.replace(parameters=list(init.parameters.values())[1:])
    except (TypeError, ValueError):
        return None
    text = stringify_signature(sig, show_annotation=False)
    return (text, return_annotation) if text != signature else None


# ---- Benchmark tables ----
def _title_bench_tables(app, docname, source):
    """Gives a page under docs/bench/ without a heading its file name as title (in memory only).

    The benchmark scripts write some tables without a title, and Sphinx cannot link to a page that
    has none.
    """
    if docname.startswith("bench/") and not source[0].lstrip().startswith("#"):
        source[0] = f"# docs/{docname}.md\n\n" + source[0]


def setup(app):
    app.connect("source-read", _title_bench_tables)
    app.connect("missing-reference", _resolve_reexport)
    app.connect("autodoc-process-signature", _constructor_signature)
