"""Thread defaults: the cgroup CPU quota and the affinity mask bound the default thread count
(faked files), and the entry points set OpenMP's passive wait policy before torch starts."""

import os
import subprocess
import sys

import pytest

from revgnn.utils import threads
from revgnn.utils.threads import cgroup_cpu_quota, default_num_threads, openmp_env_defaults


def fake_cgroup(tmp_path, v2=None, v1=None, proc="0::/\n"):
    """A fake ``/sys/fs/cgroup`` (v2 ``cpu.max`` text, or v1 ``(quota_us, period_us)``) and
    ``/proc/self/cgroup``; returns the keyword arguments for :func:`default_num_threads`."""
    root = tmp_path / "cgroup"
    root.mkdir(parents=True)
    if v2 is not None:
        (root / "cpu.max").write_text(v2 + "\n")
    if v1 is not None:
        (root / "cpu").mkdir()
        (root / "cpu" / "cpu.cfs_quota_us").write_text(f"{v1[0]}\n")
        (root / "cpu" / "cpu.cfs_period_us").write_text(f"{v1[1]}\n")
    (tmp_path / "proc_cgroup").write_text(proc)
    return dict(cgroup_root=str(root), proc_cgroup=str(tmp_path / "proc_cgroup"))


def cpus(n):
    return lambda pid: set(range(n))


def test_quota_of_one_and_a_half_cpus_gives_one_thread(tmp_path):
    kw = fake_cgroup(tmp_path, v2="150000 100000")
    assert cgroup_cpu_quota(kw["cgroup_root"], kw["proc_cgroup"]) == pytest.approx(1.5)
    assert default_num_threads(64, getaffinity=cpus(64), **kw) == 1  # rounded down, documented


def test_cgroup_v1_quota(tmp_path):
    kw = fake_cgroup(tmp_path, v1=(300000, 100000), proc="4:cpu,cpuacct:/\n")
    assert default_num_threads(64, getaffinity=cpus(64), **kw) == 3
    kw = fake_cgroup(tmp_path / "unlimited", v1=(-1, 100000), proc="4:cpu,cpuacct:/\n")
    assert default_num_threads(64, getaffinity=cpus(64), **kw) == 64


def test_quota_on_the_process_cgroup_or_an_ancestor(tmp_path):
    kw = fake_cgroup(tmp_path, v2="max 100000", proc="0::/job/step\n")
    job = tmp_path / "cgroup" / "job"
    (job / "step").mkdir(parents=True)
    (job / "cpu.max").write_text("200000 100000\n")  # the job's limit, above the process's group
    (job / "step" / "cpu.max").write_text("max 100000\n")
    assert default_num_threads(16, getaffinity=cpus(16), **kw) == 2


def test_affinity_mask_of_one_cpu_gives_one_thread(tmp_path):
    kw = fake_cgroup(tmp_path, v2="max 100000")
    assert default_num_threads(8, getaffinity=cpus(1), **kw) == 1


def test_no_quota_gives_the_affinity_count_never_above_torch(tmp_path):
    kw = fake_cgroup(tmp_path)  # no cpu.max at all
    assert cgroup_cpu_quota(kw["cgroup_root"], kw["proc_cgroup"]) is None
    assert default_num_threads(None, getaffinity=cpus(6), **kw) == 6
    assert default_num_threads(4, getaffinity=cpus(6), **kw) == 4  # torch's choice is the ceiling
    assert default_num_threads(8, getaffinity=cpus(6), **kw) == 6


def test_openmp_env_defaults_respect_the_user():
    assert openmp_env_defaults({}) == {"GOMP_SPINCOUNT": "1000"}
    for user in ({"OMP_WAIT_POLICY": "ACTIVE"}, {"OMP_WAIT_POLICY": "PASSIVE"}, {"GOMP_SPINCOUNT": "300000"}):
        assert openmp_env_defaults(dict(user)) == user  # an explicit spin count overrides the policy
    env = {"REVGNN_THREADS": "torch"}
    assert openmp_env_defaults(env) == {} and env == {"REVGNN_THREADS": "torch"}


def test_configure_threads_after_torch_warns_and_sets_the_count(monkeypatch):
    import torch

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("REVGNN_THREADS", raising=False)
    before = torch.get_num_threads()
    try:
        with pytest.warns(RuntimeWarning, match="GOMP_SPINCOUNT=1000"):
            s = threads.configure_threads()
        assert not s.openmp_env_applied and s.source == "default"
        assert s.num_threads == default_num_threads(before) == torch.get_num_threads()
        assert threads.configure_threads(1, warn=False).num_threads == 1
        with pytest.raises(ValueError):
            threads.configure_threads(0)
    finally:
        torch.set_num_threads(before)


CHILD = (
    "import os; from revgnn.utils.threads import configure_threads; s = configure_threads(); "
    "import torch; print(s.openmp_env, s.openmp_env_applied, s.source)"
)
WAIT_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")


def run_child(code, **env_extra):
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in WAIT_VARS + ("OMP_NUM_THREADS", "REVGNN_THREADS", "_REVGNN_REEXEC")
    }
    env.update(env_extra)
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, timeout=120
    ).stdout.strip()


def test_configure_threads_before_torch_sets_the_spin_count():
    assert run_child(CHILD) == "{'GOMP_SPINCOUNT': '1000'} True default"
    assert run_child(CHILD, OMP_WAIT_POLICY="ACTIVE") == "{'OMP_WAIT_POLICY': 'ACTIVE'} True default"
    assert run_child(CHILD, OMP_NUM_THREADS="1") == "{'GOMP_SPINCOUNT': '1000'} True OMP_NUM_THREADS"


def test_launcher_sets_the_spin_count_before_torch():
    code = (
        "import os; from revgnn.utils.allocator import use_tcmalloc; use_tcmalloc(); "
        "print(os.environ.get('GOMP_SPINCOUNT'), os.environ.get('LD_PRELOAD', ''))"
    )
    assert run_child(code).startswith("1000")  # also through the tcmalloc re-exec
    assert run_child(code, REVGNN_ALLOCATOR="system") == "1000"
    assert run_child(code, REVGNN_THREADS="torch").startswith("None")
