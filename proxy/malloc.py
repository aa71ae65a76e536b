"""Keep glibc from handing every large request body back to the kernel.

An agent resends its whole history, so a request body grows by a few kilobytes each turn
and passes a megabyte near turn 200. glibc serves a block that large with an mmap of its
own unless it is under a threshold, which it raises to the size of the last such block
freed; a body that is always a little larger than the one before stays above it. Every
body was then new memory that the kernel faulted in page by page: about 300 faults for a
1.3 MB body, a millisecond of system time per turn in the writer, growing with the
session. Fixed thresholds keep such blocks in the heap, where the next body reuses them.

What stays in the heap is bounded: a block of 32 MB or more still gets an mmap of its
own, and free memory above `TRIM_BYTES` at the heap's top goes back to the kernel as
before; `give_back()` returns the free pages inside the heap too, and the writer calls
it now and then.
"""

from __future__ import annotations

import ctypes
import functools
import sys

MMAP_BYTES = 32 << 20  # glibc's largest allowed threshold on 64-bit
TRIM_BYTES = 32 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # from glibc's malloc.h


@functools.cache
def _glibc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    # musl and others have no gnu_get_libc_version (and their malloc is not glibc's)
    return libc if hasattr(libc, "gnu_get_libc_version") and hasattr(libc, "mallopt") else None


def keep_large_buffers() -> bool:
    """Set the thresholds for this process; False where the C library is not glibc."""
    libc = _glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_BYTES)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, TRIM_BYTES))


def give_back() -> None:
    """Return the heap's free pages to the kernel (after a burst, say)."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
