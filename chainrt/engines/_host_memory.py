"""The host's memory as a CPU engine's admission sees it: total and available bytes.

Available is what the kernel could hand out without swapping (``MemAvailable`` in
``/proc/meminfo``: free pages plus reclaimable page cache), not ``MemFree``: on a machine that has
read a few GB of files, the page cache fills RAM and ``MemFree`` falls near zero while nearly all
of it is still there for the taking. A cgroup v2 memory limit (a container's ``--memory``) caps
both figures. Platforms without ``/proc`` fall back to ``sysconf``.
"""

from __future__ import annotations

import os
from pathlib import Path

MEMINFO = Path("/proc/meminfo")
CGROUP = Path("/sys/fs/cgroup")


def meminfo_bytes(text: str) -> dict[str, int]:
    """``/proc/meminfo``'s lines as bytes by field name (``MemTotal: 123 kB`` → 125952)."""
    fields: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if not parts or not parts[0].isdigit():
            continue
        scale = 1024 if len(parts) > 1 and parts[1] == "kB" else 1
        fields[name.strip()] = int(parts[0]) * scale
    return fields


def cgroup_limit(root: Path = CGROUP) -> tuple[int, int] | None:
    """(limit, in use) bytes of this process's cgroup v2, or None without a limit.

    In use leaves out the cgroup's inactive page cache (``inactive_file`` in ``memory.stat``),
    which the kernel reclaims before it would refuse memory."""
    try:
        limit_text = (root / "memory.max").read_text().strip()
        current_text = (root / "memory.current").read_text().strip()
    except OSError:
        return None
    if not limit_text.isdigit() or not current_text.isdigit():
        return None  # "max": no limit
    try:
        stat = (root / "memory.stat").read_text()
    except OSError:
        stat = ""
    inactive = 0
    for line in stat.splitlines():
        name, _, value = line.partition(" ")
        if name == "inactive_file" and value.strip().isdigit():
            inactive = int(value)
    return int(limit_text), max(0, int(current_text) - inactive)


def host_memory(meminfo: Path = MEMINFO, cgroup: Path = CGROUP) -> tuple[int, int]:
    """(total, available) bytes of RAM for this process."""
    try:
        fields = meminfo_bytes(meminfo.read_text())
        total, available = fields["MemTotal"], fields["MemAvailable"]
    except (OSError, KeyError):
        page = os.sysconf("SC_PAGE_SIZE")
        total = os.sysconf("SC_PHYS_PAGES") * page
        available = os.sysconf("SC_AVPHYS_PAGES") * page
    limit = cgroup_limit(cgroup)
    if limit is not None and limit[0] < total:
        cap, in_use = limit
        total = cap
        available = min(available, max(0, cap - in_use))
    return total, available
