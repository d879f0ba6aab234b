"""The CPU engines' view of host memory (chainrt/engines/_host_memory.py).

CI once failed every torch-engine test of its slow tier with HTTP 429 ``0 tokens fit now``: the
engine read ``MemFree``, which the page cache of a freshly installed machine had driven near zero.
"""

from __future__ import annotations

from pathlib import Path

from chainrt.engines._host_memory import cgroup_limit, host_memory, meminfo_bytes

# A machine after a large install: 1 GiB free, 20 GiB available (page cache).
MEMINFO = """MemTotal:       24000000 kB
MemFree:         1048576 kB
MemAvailable:   20971520 kB
Buffers:          100000 kB
HugePages_Total:       0
"""


def write_meminfo(tmp_path: Path, text: str = MEMINFO) -> Path:
    path = tmp_path / "meminfo"
    path.write_text(text)
    return path


def test_meminfo_fields_are_bytes() -> None:
    fields = meminfo_bytes(MEMINFO)
    assert fields["MemTotal"] == 24000000 * 1024
    assert fields["MemAvailable"] == 20971520 * 1024
    assert fields["HugePages_Total"] == 0  # no unit: a count, kept as is


def test_available_counts_the_page_cache_as_free(tmp_path: Path) -> None:
    total, available = host_memory(write_meminfo(tmp_path), cgroup=tmp_path / "no-cgroup")
    assert total == 24000000 * 1024
    assert available == 20 * 1024**3  # MemAvailable, not MemFree's 1 GiB


def test_a_cgroup_limit_caps_total_and_available(tmp_path: Path) -> None:
    group = tmp_path / "cg"
    group.mkdir()
    (group / "memory.max").write_text(f"{4 * 1024**3}\n")
    (group / "memory.current").write_text(f"{3 * 1024**3}\n")
    (group / "memory.stat").write_text(f"anon 1\ninactive_file {1024**3}\nactive_file 5\n")
    assert cgroup_limit(group) == (4 * 1024**3, 2 * 1024**3)
    total, available = host_memory(write_meminfo(tmp_path), cgroup=group)
    assert (total, available) == (4 * 1024**3, 2 * 1024**3)


def test_an_unlimited_cgroup_changes_nothing(tmp_path: Path) -> None:
    group = tmp_path / "cg"
    group.mkdir()
    (group / "memory.max").write_text("max\n")
    (group / "memory.current").write_text("123\n")
    assert cgroup_limit(group) is None
    assert host_memory(write_meminfo(tmp_path), cgroup=group) == (
        24000000 * 1024,
        20 * 1024**3,
    )


def test_without_meminfo_sysconf_answers(tmp_path: Path) -> None:
    total, available = host_memory(tmp_path / "absent", cgroup=tmp_path / "absent-cg")
    assert total > 0
    assert 0 <= available <= total
