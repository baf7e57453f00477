"""keep_freed_memory: freed tensor memory stays in the process instead of going back to
the kernel (so the next step's tensors are not page-faulted in again)."""

import subprocess
import sys

import pytest

CHILD = """
import sys, torch
from kiln.train.host_memory import keep_freed_memory
def rss_mb():
    for line in open('/proc/self/status'):
        if line.startswith('VmRSS'):
            return int(line.split()[1]) / 1024
if sys.argv[1] == 'keep':
    assert keep_freed_memory() and keep_freed_memory()  # applies, and again is a no-op
big = torch.ones(64 << 20)  # 256 MB, touched
before = rss_mb()
del big
after = rss_mb()
again = torch.full((64 << 20,), 2.0)
assert float(again[::4096].sum()) == 2.0 * len(again[::4096])
print(before - after)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt is Linux-only")
def test_freed_memory_stays_in_the_process_only_when_asked():
    def released(mode: str) -> float:
        out = subprocess.run([sys.executable, "-c", CHILD, mode], check=True, timeout=120,
                             capture_output=True, text=True)
        return float(out.stdout.strip())

    assert released("default") > 200  # glibc hands the 256 MB straight back
    assert released("keep") < 10
