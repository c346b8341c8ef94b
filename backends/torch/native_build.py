"""Builds and loads Lantern's native CPU kernels (kernels/*.c) with the system C compiler.

Each C file becomes a shared library in `$XDG_CACHE_HOME/lantern/cpu_kernels`, named by a hash of
its source and flags, so a change rebuilds it; processes building it at once each get a whole file
(atomic rename). For x86-64 CPUs with AVX-512; the quantized GEMMs (cpu_ops.cpp) also have a build
for AVX2 CPUs (with AVX-VNNI's dot products where the CPU has them). Elsewhere, without a compiler,
or with LANTERN_CPU_KERNELS=0, `load` returns None and the caller keeps its torch path (said once in
the log). LANTERN_CPU_ISA=avx2-vnni or avx2 builds for that level on a CPU that has more (tests, or
to compare). OpenMP comes from the libgomp torch has loaded (same soname): one thread pool.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

KERNELS = Path(__file__).parent / "kernels"
FLAGS = ["-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mfma", "-fopenmp", "-shared", "-fPIC"]
LIBS = ["-lm"]


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (Linux /proc/cpuinfo), empty elsewhere or off x86-64."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return frozenset()
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_has_avx512() -> bool:
    return {"avx512f", "avx512bw", "avx512vl"} <= cpu_flags()


ISA_LEVELS = ("avx512", "avx2-vnni", "avx2")  # best first
_ISA_NEEDS = {
    "avx512": {"avx512f", "avx512bw", "avx512vl"},
    "avx2-vnni": {"avx2", "fma", "f16c", "avx_vnni"},
    "avx2": {"avx2", "fma", "f16c"},
}
AVX2_FLAGS = {
    "avx2-vnni": ("-O3", "-mavx2", "-mfma", "-mf16c", "-mavxvnni", "-fopenmp", "-DLANTERN_AVX2", "-DLANTERN_AVXVNNI"),
    "avx2": ("-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-DLANTERN_AVX2"),
}


_warned_isa: set[str] = set()


def isa() -> str | None:
    """The best of ISA_LEVELS this CPU has, capped by LANTERN_CPU_ISA; None below AVX2 (or off x86)."""
    flags = cpu_flags()
    cap = os.environ.get("LANTERN_CPU_ISA", "avx512")
    if cap not in ISA_LEVELS and cap not in _warned_isa:
        _warned_isa.add(cap)
        logger.warning("LANTERN_CPU_ISA=%s is not one of %s: ignored", cap, ", ".join(ISA_LEVELS))
    allowed = ISA_LEVELS[ISA_LEVELS.index(cap) :] if cap in ISA_LEVELS else ISA_LEVELS
    return next((level for level in allowed if _ISA_NEEDS[level] <= flags), None)


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "lantern" / "cpu_kernels"


def build(source: Path, extra_flags: tuple[str, ...] = (), base: tuple[str, ...] | None = None) -> Path:
    """The shared library for `source`, compiled once per source and flags (base: FLAGS when None)."""
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        raise RuntimeError("no C compiler (set CC or install gcc)")
    text = source.read_bytes() + b"".join(h.read_bytes() for h in sorted(KERNELS.glob("*.h")))  # what it includes
    flags = [*(FLAGS if base is None else base), *extra_flags]
    key = hashlib.sha256(text + " ".join([compiler, *flags, *LIBS]).encode()).hexdigest()[:16]
    out = cache_dir() / f"{source.stem}-{key}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        proc = subprocess.run([compiler, *flags, str(source), "-o", tmp, *LIBS], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{compiler} failed: {proc.stderr.strip()[-500:]}")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    logger.info("built the native CPU kernels %s: %s", source.name, out)
    return out


def _switched_off(fallback: str, needs: tuple[str, ...], level: str = "avx512") -> bool:
    """True (said in one log line) when LANTERN_CPU_KERNELS=0 or the CPU lacks what the code needs:
    the ISA level it is built for (capped by LANTERN_CPU_ISA) and the flags `needs` names."""
    if os.environ.get("LANTERN_CPU_KERNELS", "1") == "0":
        logger.info("LANTERN_CPU_KERNELS=0: %s", fallback)
        return True
    if level == "avx512" and isa() != "avx512":
        logger.info("no AVX-512 on this CPU: %s", fallback)
        return True
    missing = sorted(set(needs) - cpu_flags())
    if missing:
        logger.info("this CPU lacks %s: %s", ", ".join(missing), fallback)
        return True
    return False


def load(
    source_name: str,
    fallback: str,
    *,
    extra_flags: tuple[str, ...] = (),
    needs: tuple[str, ...] = (),
    avx2: bool = False,
) -> ctypes.CDLL | None:
    """kernels/<source_name> loaded, or None with one log line saying that `fallback` serves instead.
    `extra_flags` go to the compiler, `needs` names CPU flags (/proc/cpuinfo) the code requires
    beyond AVX-512 F/BW/VL. With avx2, the file also builds for AVX2 CPUs (AVX2_FLAGS, defining
    LANTERN_AVX2, in place of FLAGS, extra_flags and needs)."""
    level = isa()
    if avx2 and level in AVX2_FLAGS:
        if _switched_off(fallback, (), level):
            return None
        base, extra_flags = (*AVX2_FLAGS[level], "-shared", "-fPIC"), ()
    else:
        if _switched_off(fallback, needs):
            return None
        base = tuple(FLAGS)
    torch.ones(2).add_(1)  # torch's OpenMP runtime is loaded before ours resolves against it
    try:
        return ctypes.CDLL(str(build(KERNELS / source_name, extra_flags, base)))
    except (RuntimeError, OSError) as e:
        logger.warning("native CPU kernels %s unavailable (%s): %s", source_name, e, fallback)
        return None


@contextlib.contextmanager
def _build_lock(build_dir: Path) -> Iterator[None]:
    """Holds an flock on build_dir while cpp_extension builds or loads there. cpp_extension's own lock
    is a file that its holder deletes when done: a process killed inside (a tensor-parallel worker
    killed while starting, a Ctrl-C during the first build) leaves it behind, and every later load
    waits for it forever. The flock dies with its process, so under it a leftover file is stale."""
    with open(build_dir / "lantern.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            stale = build_dir / "lock"
            if stale.exists():
                logger.warning("removing a build lock left by a process that died in it: %s", stale)
                stale.unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def load_ops(
    source_name: str,
    fallback: str,
    *,
    extra_flags: tuple[str, ...] = (),
    needs: tuple[str, ...] = (),
    avx2: bool = False,
) -> bool:
    """kernels/<source_name>, a C++ file registering torch ops (TORCH_LIBRARY), built with torch's
    cpp_extension and loaded into the process: True, or False with one log line saying that
    `fallback` serves instead (the same conditions as `load`). With avx2, the file also builds for
    AVX2 CPUs (AVX2_FLAGS, in place of FLAGS, extra_flags and needs). The build is cached under
    cache_dir() by a hash of the source, the kernel files it includes, the flags and torch's version."""
    level = isa()
    if avx2 and level == "avx512" and not set(needs) <= cpu_flags():  # AVX-512 without VNNI (Skylake-X)
        level = next((v for v in AVX2_FLAGS if _ISA_NEEDS[v] <= cpu_flags()), level)
    if avx2 and level in AVX2_FLAGS:
        if _switched_off(fallback, (), level):
            return False
        cflags = list(AVX2_FLAGS[level])
    else:
        if _switched_off(fallback, needs):
            return False
        cflags = [f for f in FLAGS if f not in ("-shared", "-fPIC")] + list(extra_flags)
    source = KERNELS / source_name
    if not source.is_file():  # an install without the kernel sources
        logger.warning("native CPU ops %s unavailable (no such file): %s", source_name, fallback)
        return False
    digest = hashlib.sha256(source.read_bytes())
    for c in sorted([*KERNELS.glob("*.c"), *KERNELS.glob("*.h")]):  # what the C++ file may include
        digest.update(c.read_bytes())
    digest.update(" ".join([*cflags, torch.__version__]).encode())
    name = f"lantern_{source.stem}_{digest.hexdigest()[:16]}"
    build_dir = cache_dir() / name
    try:
        from torch.utils import cpp_extension

        build_dir.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        with _build_lock(build_dir):
            cpp_extension.load(
                name=name,
                sources=[str(source)],
                extra_cflags=cflags,
                extra_ldflags=["-fopenmp"],
                extra_include_paths=[str(KERNELS)],
                build_directory=str(build_dir),
                is_python_module=False,
                verbose=False,
            )
        logger.debug("native CPU ops %s ready in %.1f s", source.name, time.monotonic() - started)
        return True
    except Exception as e:  # a compiler error, no ninja, no torch headers: the torch path serves
        logger.warning("native CPU ops %s unavailable (%s): %s", source_name, str(e).strip()[-500:], fallback)
        return False
