"""How many cores this process may use: `serve --workers cores`.

The cores it may be scheduled on (its CPU affinity), fewer when a CPU quota
allows less: a container started with `docker run --cpus 2`, a Kubernetes CPU
limit or a systemd `CPUQuota=` sees every core of the host, but gets only the
quota's worth of time on them. One worker per visible core there would run
more processes than the quota feeds, each throttled in turn (and every
throttled worker holds its requests, and on SQLite possibly the write turn,
for the rest of the period). So the quota counts too, rounded up: 1.5 cores
of quota is two workers.

The quota is read from the process's cgroups, version 2 (`cpu.max`) or
version 1 (`cpu.cfs_quota_us` over `cpu.cfs_period_us`), at its own cgroup
and every ancestor up to the hierarchy's mount, the smallest winning (a
parent's limit binds its children). Whatever cannot be read counts as no
limit: a missing quota must never stop a server from starting.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import PurePosixPath


@dataclass(frozen=True, slots=True)
class _Hierarchy:
    """Where one cgroup hierarchy that can hold a CPU quota is mounted, and
    where this process sits in it."""

    version: int  # 1 or 2
    mount_point: str  # the directory the hierarchy is mounted on
    mount_root: str  # the hierarchy's path that the mount point shows
    path: str  # this process's cgroup, as /proc/self/cgroup names it


def usable_cores(root: str = "/") -> int:
    """One or more: the cores this process may be scheduled on, or the CPU
    quota of its cgroups rounded up, whichever is fewer. `root` is where
    /proc and /sys are found (tests give a folder of made-up files)."""
    visible = _visible_cores()
    quota = cpu_quota(root)
    if quota is None:
        return visible
    return max(1, min(visible, math.ceil(quota)))


def _visible_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def cpu_quota(root: str = "/") -> float | None:
    """The smallest CPU quota, in cores, over this process's cgroups and their
    ancestors; None when none is set or none can be read."""
    try:
        memberships = _read(root, "proc/self/cgroup")
        mounts = _read(root, "proc/self/mountinfo")
    except OSError:
        return None
    quotas = [
        quota
        for hierarchy in _hierarchies(memberships, mounts)
        if (quota := _smallest_quota(root, hierarchy)) is not None
    ]
    return min(quotas, default=None)


def _hierarchies(memberships: str, mounts: str) -> list[_Hierarchy]:
    """The hierarchies with a CPU controller that this process belongs to
    and that are mounted, from /proc/self/cgroup and /proc/self/mountinfo
    (proc(5))."""
    v2_path: str | None = None
    v1_path: str | None = None
    for line in memberships.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy_id, controllers, path = parts
        if hierarchy_id == "0" and controllers == "":
            v2_path = path
        elif "cpu" in controllers.split(","):
            v1_path = path
    found: list[_Hierarchy] = []
    for line in mounts.splitlines():
        # "36 35 98:0 /root /mnt opts optional-fields - fstype source super-opts"
        head, sep, tail = line.partition(" - ")
        fields, after = head.split(), tail.split()
        if not sep or len(fields) < 5 or len(after) < 3:
            continue
        mount_root, mount_point = _unescape(fields[3]), _unescape(fields[4])
        fstype, super_options = after[0], after[2].split(",")
        if fstype == "cgroup2" and v2_path is not None:
            found.append(_Hierarchy(2, mount_point, mount_root, v2_path))
        elif fstype == "cgroup" and "cpu" in super_options and v1_path is not None:
            found.append(_Hierarchy(1, mount_point, mount_root, v1_path))
    return found


def _unescape(field: str) -> str:
    # mountinfo writes a space, tab, newline and backslash in a path as octal.
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def _smallest_quota(root: str, hierarchy: _Hierarchy) -> float | None:
    """The smallest quota from this process's cgroup up to the mount point."""
    path = PurePosixPath(hierarchy.path)
    mount_root = PurePosixPath(hierarchy.mount_root)
    try:
        inside = path.relative_to(mount_root)
    except ValueError:
        # A cgroup namespace shows the process at "/" of a mount whose root
        # is its own cgroup (a container's view): the mount point is its cgroup.
        inside = PurePosixPath()
    top = PurePosixPath(hierarchy.mount_point)
    folder = top / inside
    smallest: float | None = None
    while True:
        quota = _quota_at(root, hierarchy.version, folder)
        if quota is not None and (smallest is None or quota < smallest):
            smallest = quota
        if folder == top or folder == folder.parent:
            return smallest
        folder = folder.parent


def _quota_at(root: str, version: int, folder: PurePosixPath) -> float | None:
    try:
        if version == 2:
            # "max 100000" (no limit) or "<quota> <period>", in microseconds.
            fields = _read(root, str(folder / "cpu.max")).split()
            if len(fields) != 2 or fields[0] == "max":
                return None
            quota, period = int(fields[0]), int(fields[1])
        else:
            # -1: no limit.
            quota = int(_read(root, str(folder / "cpu.cfs_quota_us")))
            period = int(_read(root, str(folder / "cpu.cfs_period_us")))
    except (OSError, ValueError):
        return None
    if quota <= 0 or period <= 0:
        return None
    return quota / period


def _read(root: str, path: str) -> str:
    with open(os.path.join(root, path.lstrip("/")), encoding="utf-8") as handle:
        return handle.read().strip()
