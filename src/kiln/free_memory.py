"""How much memory this process could still take: torch-free, so the data reader can ask
too (kiln.train.memory_fit asks it for training, kiln.data.documents for a .json it must
parse whole)."""

from __future__ import annotations

from pathlib import Path

# (limit, usage, stat, the stat's key for inactive page cache) of cgroup v2, then v1
_CGROUP_FILES = (
    ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current",
     "/sys/fs/cgroup/memory.stat", "inactive_file"),
    ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes",
     "/sys/fs/cgroup/memory/memory.stat", "total_inactive_file"),
)


def host_memory_available() -> int | None:
    """Bytes this process could still take: the kernel's MemAvailable plus free swap, within
    the cgroup's limit where one is set; None where it cannot be told. A cgroup's usage
    counts the page cache of every file it read, which fills up to the limit after a few GB
    of data: its inactive part, which the kernel reclaims first, is not counted as used (as
    the kubelet's working set does), else a container that had read its dataset would have
    nothing free."""
    try:
        info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        free = (int(info["MemAvailable"].split()[0]) + int(info.get("SwapFree", "0 kB").split()[0])) * 1024
    except (OSError, KeyError, ValueError):
        return None
    for limit_file, usage_file, stat_file, cache_key in _CGROUP_FILES:
        try:
            limit = Path(limit_file).read_text().strip()
            used = int(Path(usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        used = max(0, used - _reclaimable_cache(stat_file, cache_key))
        if limit.isdigit() and int(limit) < 1 << 60:
            free = min(free, max(0, int(limit) - used))
        break
    return free


def _reclaimable_cache(stat_file: str, key: str) -> int:
    """The cgroup's inactive page cache in bytes (`key` in its memory.stat); 0 if unknown."""
    try:
        for line in Path(stat_file).read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0
