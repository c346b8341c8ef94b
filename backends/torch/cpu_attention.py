"""Native paged attention for CPU steps, built on first use: decode rows (kernels/cpu_paged_attention.c)
and prefill chunks (kernels/cpu_prefill_attention.c, paged_prefill below: one call a layer for all of
a step's chunks, ~2-3x faster than torch's flash kernel chunk by chunk).

The plain-torch decode path (reference.paged_decode) gathers each row's keys and values out of the
pool and then runs SDPA over the copies: per layer the context is read, written and read again,
~1.4 ms of a 32-row SmolLM2 step at 256 tokens of context (~40 ms over 30 layers). The kernel reads
each key and value once, in place through the block table, with an online softmax over fixed
position ranges, so a row's output does not depend on the other rows of its step (seeded sampling
stays reproducible under load). It covers what the reference covers: grouped-query heads, sliding
windows, soft-capped scores, attention sinks, and a V narrower than K (a view into it). float32
and bfloat16 pools (the default dtype on CPUs with native bf16): every sum is float32, the output
rounded to bf16 once; bf16 scores run on VDPBF16PS where the CPU has AVX512-BF16 (exact products
summed in float32) and values are widened in registers. Other dtypes, and CPUs or
settings without the native kernels (native_build), keep the reference path. It is a torch op with
a fake implementation, so compiled decode graphs call it as an extern kernel: a C++ op
(kernels/cpu_attention_ops.cpp) where torch's cpp_extension builds it, else a Python op over ctypes.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from lantern.backends.torch import native_build


def _flags() -> tuple[str, ...]:
    """The bf16 dot products where the CPU has them (the kernel falls back to widening loads)."""
    return ("-mavx512bf16",) if "avx512_bf16" in native_build.cpu_flags() else ()


@functools.cache
def _library() -> ctypes.CDLL | None:
    lib = native_build.load(
        "cpu_paged_attention.c", "decode attention gathers the context and runs SDPA", extra_flags=_flags()
    )
    if lib is None:
        return None
    p, i64, f32 = ctypes.c_void_p, ctypes.c_long, ctypes.c_float
    lib.lantern_paged_decode.argtypes = [
        p, i64, i64, i64,  # q, B, H, D
        p, i64, i64, p, i64, i64, i64, i64,  # k and its strides, v and its strides, Dv, KVH
        p, i64, i64, p, i64, i64,  # block tables (stride, width), lengths, block size, blocks
        f32, i64, f32, p, ctypes.c_int, p, ctypes.c_int,  # scale, window, softcap, sinks, bf16, out, threads
    ]  # fmt: skip
    lib.lantern_paged_decode.restype = ctypes.c_int
    return lib


DTYPES = (torch.float32, torch.bfloat16)


@functools.cache
def _op_ready() -> bool:
    """torch.ops.lantern.paged_decode defined, once per process: the C++ op (kernels/
    cpu_attention_ops.cpp: ~10 us a one-row SmolLM2 call, kernel included) where it builds, else
    this module's ctypes op (~18 us)."""
    if native_build.load_ops(
        "cpu_attention_ops.cpp", "decode attention calls its kernel through ctypes", extra_flags=_flags()
    ):
        torch.library.register_fake("lantern::paged_decode", _fake)
        return True
    if _library() is None:
        return False
    _register_op()
    return True


def serves(pool_dtype: torch.dtype, device: torch.device) -> bool:
    """Whether decode steps over a pool of this dtype on this device take the native kernel."""
    return torch.device(device).type == "cpu" and pool_dtype in DTYPES and _op_ready()


def paged_decode(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    block_size: int,
    scale: float,
    window: int,
    softcap: float,
    sinks: torch.Tensor | None,
) -> torch.Tensor:
    """q [B, H, D] -> [B, H, Dv]: reference.paged_decode's result (window 0 and softcap 0: none)
    for pools [slots, KVH, D] / [slots, KVH, Dv] (V may be a view into K), q, pools and the output
    all float32 or all bfloat16 (computed in float32 either way). torch.ops.lantern.paged_decode is
    this op; requires serves()."""
    lib = _library()
    if lib is None:
        raise RuntimeError("the native paged decode attention is not available")
    b, h, d = q.shape
    slots, kvh, dk = k_pool.shape
    dv = v_pool.shape[-1]
    if (
        q.dtype not in DTYPES
        or k_pool.dtype != q.dtype
        or v_pool.dtype != q.dtype
        or dk != d
        or v_pool.shape[:2] != (slots, kvh)
        or h % kvh
        or k_pool.stride(-1) != 1
        or v_pool.stride(-1) != 1
        or block_tables.dim() != 2
        or block_tables.shape[0] != b
        or seq_lens.shape != (b,)
        or slots % block_size
    ):
        raise ValueError(
            f"paged_decode: q {tuple(q.shape)} {q.dtype}, pools {tuple(k_pool.shape)} {k_pool.dtype} / "
            f"{tuple(v_pool.shape)} {v_pool.dtype}, tables {tuple(block_tables.shape)}, "
            f"lens {tuple(seq_lens.shape)} do not fit"
        )
    q = q.contiguous()
    tables = block_tables.to(torch.int32).contiguous()
    lens = seq_lens.to(torch.int32).contiguous()
    sink = None if sinks is None else sinks.detach().to(torch.float32).contiguous()
    out = torch.empty((b, h, dv), dtype=q.dtype)
    status = lib.lantern_paged_decode(
        q.data_ptr(), b, h, d,
        k_pool.data_ptr(), k_pool.stride(0), k_pool.stride(1),
        v_pool.data_ptr(), v_pool.stride(0), v_pool.stride(1), dv, kvh,
        tables.data_ptr(), tables.stride(0), tables.shape[1], lens.data_ptr(), block_size, slots // block_size,
        scale, window, softcap, None if sink is None else sink.data_ptr(), int(q.dtype == torch.bfloat16),
        out.data_ptr(), torch.get_num_threads(),
    )  # fmt: skip
    if status == -1:
        raise ValueError("paged_decode: a block table entry lies outside the KV pool")
    if status == -3:
        raise ValueError(f"paged_decode: a length needs more than the table's {tables.shape[1]} blocks")
    if status != 0:
        raise MemoryError("paged_decode: the kernel could not allocate its scratch memory")
    return out


def _fake(q, k_pool, v_pool, block_tables, seq_lens, block_size, scale, window, softcap, sinks):
    return q.new_empty((q.shape[0], q.shape[1], v_pool.shape[-1]))


def _register_op() -> None:
    """The ctypes op as torch.ops.lantern.paged_decode (see cpu_gemm._register_ops)."""
    lib = torch.library.Library("lantern", "FRAGMENT")
    lib.define(
        "paged_decode(Tensor q, Tensor k_pool, Tensor v_pool, Tensor block_tables, Tensor seq_lens, "
        "int block_size, float scale, int window, float softcap, Tensor? sinks) -> Tensor"
    )
    lib.impl("paged_decode", paged_decode, "CPU")
    torch.library.register_fake("lantern::paged_decode", _fake, lib=lib)
    torch.library._lantern_cpu_attention_ops = lib  # type: ignore[attr-defined]


@functools.cache
def _prefill_library() -> ctypes.CDLL | None:
    lib = native_build.load(
        "cpu_prefill_attention.c", "prefill attention runs torch's SDPA chunk by chunk", extra_flags=_flags()
    )
    if lib is None:
        return None
    p, i64, f32 = ctypes.c_void_p, ctypes.c_long, ctypes.c_float
    lib.lantern_prefill_attention.argtypes = [
        p, i64, i64, i64, i64,  # q and its strides, H, D
        p, i64, i64, p, i64, i64, i64, i64,  # k and its strides, v and its strides, Dv, KVH
        i64, p, p, p, p, i64, i64, i64, i64,  # groups, q_start, q_len, ctx_len, tables (+ stride, width), bs, blocks
        f32, i64, f32, p, ctypes.c_int, p, ctypes.c_int,  # scale, window, softcap, sinks, bf16, out, threads
    ]  # fmt: skip
    lib.lantern_prefill_attention.restype = ctypes.c_int
    return lib


def serves_prefill(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor) -> bool:
    """Whether paged_prefill takes these tensors (the native kernel is built on first ask)."""
    return (
        q.device.type == "cpu"
        and q.dtype in DTYPES
        and k_pool.dtype == q.dtype
        and v_pool.dtype == q.dtype
        and q.stride(-1) == 1
        and k_pool.stride(-1) == 1
        and v_pool.stride(-1) == 1
        and _prefill_library() is not None
    )


def paged_prefill(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    groups: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    block_size: int,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Every prefill chunk of a step in one call: groups = (q_start, q_len, ctx_len: int64 [G], block
    tables: int32 [G, width]); chunk g is q[q_start[g]:q_start[g] + q_len[g]] (q [T, H, D], rows
    strided as they come), the last q_len[g] positions of its ctx_len[g], whose keys and values are
    in the pools already. Returns [sum(q_len), H, Dv], chunk after chunk: reference.paged_prefill's
    result for each, computed in float32. Requires serves_prefill()."""
    lib = _prefill_library()
    assert lib is not None
    q_start, q_len, ctx_len, tables = groups
    _, h, d = q.shape
    slots, kvh, dk = k_pool.shape
    dv = v_pool.shape[-1]
    if (
        not serves_prefill(q, k_pool, v_pool)
        or dk != d
        or v_pool.shape[:2] != (slots, kvh)
        or h % kvh
        or slots % block_size
        or tables.dim() != 2
        or tables.dtype != torch.int32
        or not tables.is_contiguous()
        or any(x.dtype != torch.int64 or x.shape != (tables.shape[0],) for x in (q_start, q_len, ctx_len))
        or (sinks is not None and sinks.numel() != h)
    ):
        raise ValueError(
            f"paged_prefill: q {tuple(q.shape)} {q.dtype}, pools {tuple(k_pool.shape)} {k_pool.dtype} / "
            f"{tuple(v_pool.shape)} {v_pool.dtype}, tables {tuple(tables.shape)} {tables.dtype} do not fit"
        )
    sink = None if sinks is None else sinks.detach().to(torch.float32).contiguous()
    out = torch.empty((int(q_len.sum()), h, dv), dtype=q.dtype)
    status = lib.lantern_prefill_attention(
        q.data_ptr(), q.stride(0), q.stride(1), h, d,
        k_pool.data_ptr(), k_pool.stride(0), k_pool.stride(1), v_pool.data_ptr(), v_pool.stride(0), v_pool.stride(1),
        dv, kvh, len(q_start), q_start.data_ptr(), q_len.data_ptr(), ctx_len.data_ptr(), tables.data_ptr(),
        tables.stride(0), tables.shape[1], block_size, slots // block_size, scale, _window(window), softcap or 0.0,
        None if sink is None else sink.data_ptr(), int(q.dtype == torch.bfloat16), out.data_ptr(),
        torch.get_num_threads(),
    )  # fmt: skip
    if status == -1:
        raise ValueError("paged_prefill: a block table entry lies outside the KV pool")
    if status == -3:
        raise ValueError(f"paged_prefill: a length needs more than the table's {tables.shape[1]} blocks")
    if status != 0:
        raise MemoryError("paged_prefill: the kernel could not allocate its scratch memory")
    return out


def _window(window: int | None) -> int:
    """The kernel's window: 0 for none, and for one wider than any position (it compares int32 positions)."""
    return window if window is not None and 0 < window < 2**31 - 1 else 0


def prefill_groups(prefills: list, device: torch.device) -> tuple[torch.Tensor, ...]:
    """paged_prefill's `groups` for a step's attention.PrefillGroup list (made once a step)."""
    width = max(g.block_table.shape[0] for g in prefills)
    # padded with -1: a context longer than its own table is refused (-1: outside the pool), not read from block 0
    tables = torch.full((len(prefills), width), -1, dtype=torch.int32, device=device)
    for i, g in enumerate(prefills):
        tables[i, : g.block_table.shape[0]] = g.block_table
    as_long = lambda xs: torch.tensor(xs, dtype=torch.int64, device=device)
    return (
        as_long([g.q_start for g in prefills]),
        as_long([g.q_end - g.q_start for g in prefills]),
        as_long([g.ctx_len for g in prefills]),
        tables,
    )
