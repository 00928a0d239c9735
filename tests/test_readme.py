"""The README's example of using the blocks in one's own model runs as written."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_example_runs():
    text = README.read_text()
    match = re.search(r"<!-- readme-example -->\s*```python\n(.*?)```", text, re.S)
    assert match, "README lost its example block"
    namespace = {}
    exec(compile(match.group(1), str(README), "exec"), namespace)
    model = namespace["model"]
    assert all(p.grad is not None for p in model.parameters())
    assert namespace["out"].shape == (100, 64)


def test_readme_commands_are_what_ci_runs():
    text = README.read_text()
    assert "bash scripts/test.sh" in text and "bash scripts/run.sh" in text
    ci = (README.parent / ".ci" / "run").read_text()
    assert "bash scripts/test.sh" in ci
