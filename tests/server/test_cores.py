"""`serve --workers cores`: the cores a process may use, its CPU quota counted,
read from made-up /proc and /sys trees laid out as Linux lays them out
(proc(5) for /proc/self/cgroup and mountinfo, the kernel's cgroup-v1 CFS and
cgroup-v2 cpu.max files)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fencepost.server.cores import cpu_quota, usable_cores

V2_MOUNT = (
    "30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw\n"
)
V1_CPU_MOUNT = (
    "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:9 - cgroup cgroup rw,cpu,cpuacct\n"
)
V1_MEMORY_MOUNT = "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"


def _tree(root: Path, cgroup: str, mountinfo: str, files: dict[str, str]) -> str:
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/cgroup").write_text(cgroup)
    (root / "proc/self/mountinfo").write_text(mountinfo)
    for path, text in files.items():
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text + "\n")
    return str(root)


def test_no_quota_anywhere_is_no_limit(tmp_path: Path) -> None:
    root = _tree(tmp_path, "0::/system.slice/fencepost.service\n", V2_MOUNT, {
        "/sys/fs/cgroup/system.slice/fencepost.service/cpu.max": "max 100000",
        "/sys/fs/cgroup/system.slice/cpu.max": "max 100000",
    })
    assert cpu_quota(root) is None
    assert usable_cores(root) == len(os.sched_getaffinity(0))


def test_cgroup_v2_quota_of_the_process_own_cgroup(tmp_path: Path) -> None:
    root = _tree(tmp_path, "0::/system.slice/fencepost.service\n", V2_MOUNT, {
        "/sys/fs/cgroup/system.slice/fencepost.service/cpu.max": "150000 100000",
    })
    assert cpu_quota(root) == 1.5
    assert usable_cores(root) == min(2, len(os.sched_getaffinity(0)))  # rounded up


def test_a_parent_limit_binds_its_children(tmp_path: Path) -> None:
    root = _tree(tmp_path, "0::/kubepods/burstable/pod1/ctr\n", V2_MOUNT, {
        "/sys/fs/cgroup/kubepods/burstable/pod1/ctr/cpu.max": "max 100000",
        "/sys/fs/cgroup/kubepods/burstable/pod1/cpu.max": "50000 100000",
        "/sys/fs/cgroup/kubepods/burstable/cpu.max": "400000 100000",
    })
    assert cpu_quota(root) == 0.5
    assert usable_cores(root) == 1


def test_a_container_sees_its_own_cgroup_at_the_mount(tmp_path: Path) -> None:
    """With a cgroup namespace the process is at "/" and the mount is its cgroup."""
    root = _tree(tmp_path, "0::/\n", V2_MOUNT, {"/sys/fs/cgroup/cpu.max": "200000 100000"})
    assert cpu_quota(root) == 2.0


def test_a_path_outside_the_mount_root_reads_the_mount_point(tmp_path: Path) -> None:
    """A mount of a subtree (its root is not "/") that the process's path is not
    under: the mount point is the nearest cgroup to read, not an error."""
    mount = "30 23 0:26 /docker/abc /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
    root = _tree(tmp_path, "0::/elsewhere\n", mount, {"/sys/fs/cgroup/cpu.max": "300000 100000"})
    assert cpu_quota(root) == 3.0


def test_a_mount_of_a_subtree_finds_the_process_inside_it(tmp_path: Path) -> None:
    mount = "30 23 0:26 /docker /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
    root = _tree(tmp_path, "0::/docker/abc\n", mount, {
        "/sys/fs/cgroup/abc/cpu.max": "120000 100000",
    })
    assert cpu_quota(root) == 1.2


def test_cgroup_v1_cfs_quota(tmp_path: Path) -> None:
    root = _tree(
        tmp_path, "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n",
        V1_MEMORY_MOUNT + V1_CPU_MOUNT,
        {
            "/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "250000",
            "/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000",
            "/sys/fs/cgroup/cpu,cpuacct/docker/cpu.cfs_quota_us": "-1",
            "/sys/fs/cgroup/cpu,cpuacct/docker/cpu.cfs_period_us": "100000",
        },
    )
    assert cpu_quota(root) == 2.5


def test_cgroup_v1_without_a_quota(tmp_path: Path) -> None:
    root = _tree(tmp_path, "3:cpu,cpuacct:/\n", V1_CPU_MOUNT, {
        "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "-1",
        "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000",
    })
    assert cpu_quota(root) is None


def test_only_a_cpu_hierarchy_counts(tmp_path: Path) -> None:
    """A memory hierarchy's files are not read as a CPU quota, even if a
    cpu.max-looking file sits there."""
    root = _tree(tmp_path, "4:memory:/x\n", V1_MEMORY_MOUNT, {
        "/sys/fs/cgroup/memory/x/cpu.cfs_quota_us": "50000",
        "/sys/fs/cgroup/memory/x/cpu.cfs_period_us": "100000",
    })
    assert cpu_quota(root) is None


def test_both_versions_mounted_the_smaller_wins(tmp_path: Path) -> None:
    root = _tree(
        tmp_path, "3:cpu,cpuacct:/a\n0::/a\n", V1_CPU_MOUNT + V2_MOUNT.replace(
            "/sys/fs/cgroup ", "/sys/fs/cgroup/unified "),
        {
            "/sys/fs/cgroup/cpu,cpuacct/a/cpu.cfs_quota_us": "300000",
            "/sys/fs/cgroup/cpu,cpuacct/a/cpu.cfs_period_us": "100000",
            "/sys/fs/cgroup/unified/a/cpu.max": "100000 100000",
        },
    )
    assert cpu_quota(root) == 1.0


def test_an_escaped_mount_point(tmp_path: Path) -> None:
    mount = "30 23 0:26 / /sys/fs/my\\040cgroups rw - cgroup2 cgroup2 rw\n"
    root = _tree(tmp_path, "0::/a\n", mount, {"/sys/fs/my cgroups/a/cpu.max": "70000 100000"})
    assert cpu_quota(root) == 0.7


@pytest.mark.parametrize("cpu_max", ["", "garbage", "50000", "0 100000", "-5 100000",
                                     "50000 0", "max", "1 2 3"])
def test_unreadable_quotas_are_no_limit(tmp_path: Path, cpu_max: str) -> None:
    root = _tree(tmp_path, "0::/a\n", V2_MOUNT, {"/sys/fs/cgroup/a/cpu.max": cpu_max})
    assert cpu_quota(root) is None


@pytest.mark.parametrize("cgroup,mountinfo", [
    ("", ""),
    ("not a cgroup line\n", "not a mount line\n"),
    ("0::/a\n", "30 23 0:26 / /sys/fs/cgroup rw cgroup2 cgroup2 rw\n"),  # no " - "
    ("0::/a\n", "30 - cgroup2\n"),
])
def test_malformed_proc_files_are_no_limit(tmp_path: Path, cgroup: str, mountinfo: str) -> None:
    root = _tree(tmp_path, cgroup, mountinfo, {"/sys/fs/cgroup/a/cpu.max": "50000 100000"})
    assert cpu_quota(root) is None


def test_no_proc_at_all_is_no_limit(tmp_path: Path) -> None:
    assert cpu_quota(str(tmp_path)) is None
    assert usable_cores(str(tmp_path)) == len(os.sched_getaffinity(0))


def test_a_quota_never_gives_more_workers_than_visible_cores(tmp_path: Path) -> None:
    root = _tree(tmp_path, "0::/\n", V2_MOUNT, {"/sys/fs/cgroup/cpu.max": "6400000 100000"})
    assert cpu_quota(root) == 64.0
    assert usable_cores(root) == len(os.sched_getaffinity(0))
