"""How much memory this process could still take: torch-free, so the data reader can ask
too (kiln.train.memory_fit asks it for training, kiln.data.documents for a .json it must
parse whole)."""

from __future__ import annotations

from pathlib import Path


def host_memory_available() -> int | None:
    """Bytes this process could still take: the kernel's MemAvailable plus free swap, within
    the cgroup's limit where one is set; None where it cannot be told."""
    try:
        info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        free = (int(info["MemAvailable"].split()[0]) + int(info.get("SwapFree", "0 kB").split()[0])) * 1024
    except (OSError, KeyError, ValueError):
        return None
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            limit = Path(limit_file).read_text().strip()
            used = int(Path(usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 1 << 60:
            free = min(free, max(0, int(limit) - used))
        break
    return free
