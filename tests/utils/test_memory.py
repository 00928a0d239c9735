"""The process's peak RSS as :func:`revgnn.utils.memory.peak_rss_bytes` reports it."""

from __future__ import annotations

import os
import sys

import pytest
from conftest import run_cli

from revgnn.utils.memory import peak_rss_bytes

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's VmHWM")


def test_a_spawned_process_reports_its_own_peak_not_its_parents():
    """A child started after its parent touched ``big`` bytes reports its own peak (an interpreter
    importing torch), where ``ru_maxrss`` reports the parent's peak, above ``big``."""
    big, page = 1 << 30, os.sysconf("SC_PAGE_SIZE")
    buf = bytearray(big)
    buf[::page] = b"\1" * (big // page)  # resident
    assert peak_rss_bytes() > big
    child = (
        "import resource; from revgnn.utils.memory import peak_rss_bytes; "
        "print(peak_rss_bytes(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)"
    )
    own, maxrss = map(int, run_cli("-c", child).stdout.split())
    del buf
    assert own < big // 2 < big < maxrss, (own, maxrss)


def test_peak_is_at_least_the_current_rss():
    with open("/proc/self/statm") as f:
        current = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    assert peak_rss_bytes() >= current > 0
