"""glibc malloc settings for the torch backend on a CPU: freed activation memory is kept for reuse.

torch's CPU allocator is plain malloc. With glibc's defaults every tensor above its dynamic mmap
threshold (at most 32 MiB) is a fresh mmap, and freed memory at the heap's top is handed back to
the kernel, so each step maps, faults in and zeroes its activations again: a 4,096-token prefill
of SmolLM2-135M took ~436,000 minor page faults (~1.7 GB of pages), ~25 with the settings below,
with the engine on the main thread (the Python API, `lantern bench`). The server's engine thread
allocates from a glibc thread arena, which kept its memory anyway (~1,000 faults either way).
jemalloc and tcmalloc (which vLLM's CPU backend asks users to preload) avoid it the same way: memory
freed by one step serves the next.

The cost: up to KEEP_BYTES of freed memory stays resident between steps (the process does not
shrink after a large prefill until the heap's free top exceeds it). Applied after the weights and
the KV pool are allocated, so loading still returns its transient buffers. LANTERN_MALLOC_TUNING=0
leaves glibc's defaults.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform

logger = logging.getLogger(__name__)

KEEP_BYTES = 1 << 30
_M_TRIM_THRESHOLD = -1  # mallopt parameter numbers (malloc.h)
_M_MMAP_THRESHOLD = -3
_applied = False


def keep_freed_memory(keep_bytes: int = KEEP_BYTES) -> bool:
    """Raise glibc's mmap and trim thresholds to `keep_bytes` (once per process). False where the C
    library is not glibc, where LANTERN_MALLOC_TUNING=0, or where mallopt refuses a value."""
    global _applied
    if _applied:
        return True
    if os.environ.get("LANTERN_MALLOC_TUNING") == "0" or platform.system() != "Linux":
        return False
    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    value = min(keep_bytes, 2**31 - 1)  # mallopt takes an int
    # Both are needed: a trim threshold alone turns off glibc's dynamic mmap threshold, and every
    # allocation above 128 KiB becomes an mmap (measured: 5x the page faults of the defaults).
    if not (mallopt(_M_MMAP_THRESHOLD, value) and mallopt(_M_TRIM_THRESHOLD, value)):
        logger.warning("glibc mallopt refused the CPU allocator settings; keeping its defaults")
        return False
    _applied = True
    logger.info("CPU allocator: glibc keeps up to %d MiB of freed memory for reuse", value >> 20)
    return True
