"""The documentation's hand-written layout page names every module of the package."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_layout_page_names_every_module():
    text = (ROOT / "docs" / "layout.md").read_text()
    block = re.search(r"```\n(.*?)```", text, re.S).group(1)
    # each line is "<directory or file>   <entries>" or a continuation of the previous directory's
    named, directory = set(), None
    for line in block.splitlines():
        head = line[:21].strip()
        if head:
            directory = head if head.endswith("/") else str(Path(head).parent) + "/"
            if not head.endswith("/"):
                named.add(head)
        for name in re.findall(r"[\w/]+\.(?:py|cpp)", line[21:]):
            named.add(name if "/" in name else directory + name)
    modules = {
        str(p.relative_to(ROOT))
        for p in (ROOT / "revgnn").rglob("*")
        if p.suffix in (".py", ".cpp") and p.name != "__init__.py" and "configs" not in p.parts
    }
    missing = sorted(modules - named)
    assert not missing, f"docs/layout.md does not name {missing}: add each to its directory's line"
    stale = sorted(n for n in named if n.startswith("revgnn/") and n not in modules)
    assert not stale, f"docs/layout.md names files that do not exist: {stale}"
