"""proxy/malloc.py: request bodies that grow each turn reuse the heap instead of costing
page faults, and the heap goes back to the kernel when asked. Each case runs in a
process of its own, so the settings never reach the test process."""

import subprocess
import sys

import pytest

from proxy import malloc

pytestmark = pytest.mark.skipif(malloc._glibc() is None, reason="glibc's malloc settings (this is not glibc)")

GROWING_BODIES = """
import resource, sys
from proxy import malloc
assert {tune} is False or malloc.keep_large_buffers()
kept = []
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for k in range(100):  # an agent's bodies: each a little larger than the one before
    body = b"x" * (1_000_000 + 4096 * k)
    kept.append(body)
    if len(kept) > 4:
        kept.pop(0)
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 100)
"""

GIVE_BACK = """
from proxy import malloc

def rss_mb():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024

assert malloc.keep_large_buffers()
held = [b"y" * (1 << 20) for _ in range(24)]
full = rss_mb()
del held
kept = rss_mb()  # freed, but under the trim threshold: still in the heap
malloc.give_back()
print(full, kept, rss_mb())
"""


def run(code: str) -> list[float]:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [float(x) for x in out.stdout.split()]


def test_growing_bodies_reuse_the_heap_instead_of_faulting_in_new_pages():
    (untuned,) = run(GROWING_BODIES.format(tune=False))
    (tuned,) = run(GROWING_BODIES.format(tune=True))
    assert untuned > 200  # glibc's own threshold: every body a new mapping, ~250 pages faulted in
    assert tuned < untuned / 5, (untuned, tuned)


def test_give_back_returns_the_free_heap_to_the_kernel():
    full, kept, after = run(GIVE_BACK)
    assert kept > full - 8  # the 24 MB freed stayed in the heap, ready for the next bodies
    assert after < kept - 16, (full, kept, after)
