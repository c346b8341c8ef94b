"""A native int4 GEMM for batched CPU decode steps: kernels/cpu_int4pack_gemm.c, built on first use.

aten's `_weight_int4pack_mm_for_cpu` decodes the weights again for every few rows of x, so its cost
grows with the rows: at 32 decode rows it computes at ~45 GFLOPS on 2 Xeon cores, while the same
product from float32 panels decoded once per 64-row block runs ~1.7x faster. The kernel reads the
int4pack layout in place (no second copy of the weights) and gives aten's results bit for bit (x and
the output rounded to bf16 as aten rounds them, the same weights and order of sums; the tests check
it), so a row's logits do not depend on how many rows share its step. It serves rows MIN_ROWS ..
DENSE_ROWS - 1; fewer stay on aten's kernel (one row is bound by memory, and aten reads it faster),
prefill on the dense path.

Built with the system C compiler (`$CC`, else `cc`) for x86-64 CPUs with AVX-512, into
`$XDG_CACHE_HOME/lantern/cpu_kernels` under a hash of the source and flags, so a change rebuilds
it; elsewhere, without a compiler, or with LANTERN_CPU_KERNELS=0, the layers keep aten's kernel
(said once in the log). It is a torch custom op, so compiled decode graphs call it like any
extern kernel. OpenMP comes from the libgomp torch has loaded (same soname): one thread pool.
"""

from __future__ import annotations

import ctypes
import functools
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

MIN_ROWS = 12  # below, aten's kernel is as fast or faster (at 8 rows: 0.9-1.4x the native one's time)
_SOURCE = Path(__file__).parent / "kernels" / "cpu_int4pack_gemm.c"
_FLAGS = ["-O3", "-mavx512f", "-mavx512bw", "-mfma", "-fopenmp", "-shared", "-fPIC"]


def _cpu_has_avx512() -> bool:
    if platform.machine() not in ("x86_64", "AMD64"):
        return False
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx512f" in flags and " avx512bw" in flags


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "lantern" / "cpu_kernels"


def _build(source: Path) -> Path:
    """The shared library for `source`, compiled once per source and flags (atomic rename, so
    processes building it at once each get a whole file)."""
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        raise RuntimeError("no C compiler (set CC or install gcc)")
    text = source.read_bytes()
    key = hashlib.sha256(text + " ".join([compiler, *_FLAGS]).encode()).hexdigest()[:16]
    out = _cache_dir() / f"{source.stem}-{key}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        proc = subprocess.run([compiler, *_FLAGS, str(source), "-o", tmp], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{compiler} failed: {proc.stderr.strip()[-500:]}")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    logger.info("built the native int4 CPU GEMM: %s", out)
    return out


@functools.cache
def _library() -> ctypes.CDLL | None:
    if os.environ.get("LANTERN_CPU_KERNELS", "1") == "0":
        logger.info("LANTERN_CPU_KERNELS=0: batched int4 decode uses aten's kernel")
        return None
    if not _cpu_has_avx512():
        logger.info("no AVX-512 on this CPU: batched int4 decode uses aten's kernel")
        return None
    torch.ones(2).add_(1)  # torch's OpenMP runtime is loaded before ours resolves against it
    try:
        lib = ctypes.CDLL(str(_build(_SOURCE)))
    except (RuntimeError, OSError) as e:
        logger.warning("native int4 CPU GEMM unavailable (%s): batched int4 decode uses aten's kernel", e)
        return None
    fn = lib.lantern_int4pack_mm
    p, i64 = ctypes.c_void_p, ctypes.c_long
    fn.argtypes = [p, i64, i64, p, p, i64, i64, p, i64, ctypes.c_int]
    fn.restype = ctypes.c_int
    return lib


def available() -> bool:
    """Whether the native kernel serves batched int4 steps in this process."""
    return _library() is not None


# A plain Library op rather than torch.library.custom_op: the call costs ~16 us instead of ~31.
_OPS = torch.library.Library("lantern", "DEF")
_OPS.define("int4pack_mm_f32(Tensor x, Tensor packed, Tensor scales_and_zeros, int group_size, int n) -> Tensor")


def int4pack_mm_f32(
    x: torch.Tensor, packed: torch.Tensor, scales_and_zeros: torch.Tensor, group_size: int, n: int
) -> torch.Tensor:
    """x [M, K] float32 @ W.T -> [M, n] float32, W an int4pack weight (quant_linear.Int4PackLinear's
    buffers): the native kernel from MIN_ROWS rows, aten's below (chosen here, not by the caller, so
    that a compiled graph over a symbolic row count needs no guard on it). Requires available();
    torch.ops.lantern.int4pack_mm_f32 is this op."""
    m, k = x.shape
    if m < MIN_ROWS:
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), packed, group_size, scales_and_zeros)
        return y[:, :n].float()
    lib = _library()
    if lib is None:
        raise RuntimeError("the native int4 CPU GEMM is not available")
    if x.dtype != torch.float32 or not x.is_contiguous():
        x = x.float().contiguous()
    n_pad = scales_and_zeros.shape[1]
    if k % group_size or k % 2 or packed.numel() * 2 != n_pad * k or n > n_pad:
        raise ValueError(f"int4pack_mm_f32: x {tuple(x.shape)} does not fit the packed weight [{n_pad}, {k}]")
    y = torch.empty((m, n), dtype=torch.float32)
    args = (x.data_ptr(), m, k, packed.data_ptr(), scales_and_zeros.data_ptr(), group_size, n_pad, y.data_ptr(), n)
    if lib.lantern_int4pack_mm(*args, torch.get_num_threads()) != 0:
        raise MemoryError("int4pack_mm_f32: the kernel could not allocate its panels")
    return y


_OPS.impl("int4pack_mm_f32", int4pack_mm_f32, "CPU")


@torch.library.register_fake("lantern::int4pack_mm_f32")
def _(x: torch.Tensor, packed: torch.Tensor, scales_and_zeros: torch.Tensor, group_size: int, n: int) -> torch.Tensor:
    return x.new_empty((x.shape[0], n), dtype=torch.float32)
