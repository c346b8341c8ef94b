"""Builds and loads Lantern's native CPU kernels (kernels/*.c) with the system C compiler.

Each C file becomes a shared library in `$XDG_CACHE_HOME/lantern/cpu_kernels`, named by a hash of
its source and flags, so a change rebuilds it; processes building it at once each get a whole file
(atomic rename). Only for x86-64 CPUs with AVX-512; elsewhere, without a compiler, or with
LANTERN_CPU_KERNELS=0, `load` returns None and the caller keeps its torch path (said once in the
log). OpenMP comes from the libgomp torch has loaded (same soname): one thread pool.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

KERNELS = Path(__file__).parent / "kernels"
FLAGS = ["-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mfma", "-fopenmp", "-shared", "-fPIC"]
LIBS = ["-lm"]


def cpu_has_avx512() -> bool:
    if platform.machine() not in ("x86_64", "AMD64"):
        return False
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx512f" in flags and " avx512bw" in flags and " avx512vl" in flags


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "lantern" / "cpu_kernels"


def build(source: Path) -> Path:
    """The shared library for `source`, compiled once per source and flags."""
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        raise RuntimeError("no C compiler (set CC or install gcc)")
    text = source.read_bytes()
    key = hashlib.sha256(text + " ".join([compiler, *FLAGS, *LIBS]).encode()).hexdigest()[:16]
    out = cache_dir() / f"{source.stem}-{key}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        proc = subprocess.run([compiler, *FLAGS, str(source), "-o", tmp, *LIBS], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{compiler} failed: {proc.stderr.strip()[-500:]}")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    logger.info("built the native CPU kernels %s: %s", source.name, out)
    return out


def load(source_name: str, fallback: str) -> ctypes.CDLL | None:
    """kernels/<source_name> loaded, or None with one log line saying that `fallback` serves instead."""
    if os.environ.get("LANTERN_CPU_KERNELS", "1") == "0":
        logger.info("LANTERN_CPU_KERNELS=0: %s", fallback)
        return None
    if not cpu_has_avx512():
        logger.info("no AVX-512 on this CPU: %s", fallback)
        return None
    torch.ones(2).add_(1)  # torch's OpenMP runtime is loaded before ours resolves against it
    try:
        return ctypes.CDLL(str(build(KERNELS / source_name)))
    except (RuntimeError, OSError) as e:
        logger.warning("native CPU kernels %s unavailable (%s): %s", source_name, e, fallback)
        return None
