"""The README's commands are what CI runs, and the guide's example runs as written.

The README's own example is a doctest, run by ``scripts/docs.sh`` (with the docstring examples).
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BLOCKS_GUIDE = ROOT / "docs" / "guides" / "blocks.md"


def test_blocks_guide_example_runs():
    text = BLOCKS_GUIDE.read_text()
    match = re.search(r"<!-- tested-example -->\s*```python\n(.*?)```", text, re.S)
    assert match, f"{BLOCKS_GUIDE} lost its example block (marked <!-- tested-example -->)"
    namespace = {}
    exec(compile(match.group(1), str(BLOCKS_GUIDE), "exec"), namespace)
    model = namespace["model"]
    assert all(p.grad is not None for p in model.parameters())
    assert namespace["out"].shape == (100, 64)


def test_readme_commands_are_what_ci_runs():
    text = README.read_text()
    assert "bash scripts/test.sh" in text and "bash scripts/run.sh" in text
    ci = (README.parent / ".ci" / "run").read_text()
    assert "bash scripts/test.sh" in ci
