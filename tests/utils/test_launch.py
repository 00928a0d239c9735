"""The entry-point launcher preloads tcmalloc (flat peak RSS) when it is installed."""

import os
import subprocess
import sys

import pytest

from revgnn.utils.allocator import find_tcmalloc

CODE = "from revgnn.utils.allocator import use_tcmalloc, allocator; use_tcmalloc(); print(allocator())"


def run(env_extra):
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "_REVGNN_REEXEC")}
    env.update(env_extra)
    out = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


@pytest.mark.skipif(find_tcmalloc() is None, reason="tcmalloc not installed")
def test_reexec_with_tcmalloc_by_default():
    assert run({}) == "tcmalloc"


def test_system_allocator_can_be_kept():
    assert run({"REVGNN_ALLOCATOR": "system"}) == "system"
