"""Ops of the torch backend: Triton kernels on CUDA, native ones for bf16 norms, rope and SiLU on an
x86 CPU with AVX-512 or AVX2 (cpu_elementwise), their plain-torch references elsewhere."""

from __future__ import annotations

import importlib.util
import os

import torch

from lantern.backends.torch import cpu_elementwise
from lantern.backends.torch.kernels import reference

_HAS_TRITON = importlib.util.find_spec("triton") is not None


def use_triton(t: torch.Tensor) -> bool:
    # Asked several times per layer: the CPU answer must cost nothing.
    return t.is_cuda and _HAS_TRITON and os.environ.get("LANTERN_DISABLE_TRITON") != "1"


def _same_width(k_pool, v_pool) -> bool:
    """False for multi-head latent attention's V (K's first columns): the Triton kernels take one
    head size for K and V, so such pools take the reference path."""
    return v_pool is not None and k_pool.shape[-1] == v_pool.shape[-1]


def write_kv(k_pool, v_pool, k, v, slots, may_skip: bool = True) -> None:
    """v_pool and v None: a pool whose V lies inside K (only K is written). may_skip=False: no
    slot is negative (the reference path then needs no check)."""
    if use_triton(k) and v_pool is not None:
        from lantern.backends.torch.kernels import triton_kernels

        return triton_kernels.write_kv(k_pool, v_pool, k, v, slots)
    return reference.write_kv(k_pool, v_pool, k, v, slots, may_skip)


def paged_decode(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    block_size: int,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    ctx_cache: dict | None = None,
    native: bool = False,
    alibi: torch.Tensor | None = None,
) -> torch.Tensor:
    """ctx_cache: a dict living for one step, where the reference path keeps each window's
    gather (reference.decode_context) for the next layers. native: the pool is one that
    cpu_attention serves (float32 or bfloat16 on a CPU with the native kernels), which reads it in place.
    alibi: ALiBi's slopes per query head, which only the reference path computes."""
    if native and alibi is None:
        return torch.ops.lantern.paged_decode(
            q, k_pool, v_pool, block_tables, seq_lens, block_size, scale, window or 0, softcap or 0.0, sinks
        )
    if use_triton(q) and _same_width(k_pool, v_pool) and alibi is None:
        from lantern.backends.torch.kernels import triton_kernels

        return triton_kernels.paged_decode(
            q, k_pool, v_pool, block_tables, seq_lens, block_size, scale, window=window, softcap=softcap, sinks=sinks
        )
    ctx = None if ctx_cache is None else ctx_cache.get(("decode", window))
    if ctx is None:
        ctx = reference.decode_context(block_tables, seq_lens, block_size, window)
        if ctx_cache is not None:
            ctx_cache[("decode", window)] = ctx
    return reference.paged_decode(
        q, k_pool, v_pool, block_tables, seq_lens, block_size, scale, window, softcap, sinks, ctx=ctx, alibi=alibi
    )


def paged_prefill(
    q,
    k_pool,
    v_pool,
    block_table,
    ctx_len: int,
    block_size: int,
    scale: float,
    window=None,
    softcap=None,
    sinks=None,
    alibi=None,
):
    if use_triton(q) and _same_width(k_pool, v_pool) and alibi is None:
        from lantern.backends.torch.kernels import triton_kernels

        return triton_kernels.paged_prefill(
            q, k_pool, v_pool, block_table, ctx_len, block_size, scale, window=window, softcap=softcap, sinks=sinks
        )
    return reference.paged_prefill(
        q, k_pool, v_pool, block_table, ctx_len, block_size, scale, window, softcap, sinks, alibi
    )


def rotary_write_kv(
    qk: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor | None,
    slots: torch.Tensor,
) -> torch.Tensor | None:
    """rotary(qk) of q's heads then k's [T, H + KVH, D], with the rotated k and v [T, KVH, D] written into the pools
    at `slots`, in one kernel where Triton takes it (CUDA; a rope over the whole head; K and V pools of one width);
    None: nothing done, the caller ropes and writes as usual."""
    if not use_triton(qk) or not _same_width(k_pool, v_pool) or cos.shape[-1] != qk.shape[-1]:
        return None
    if v.shape[-1] != qk.shape[-1] or qk.shape[-1] % 2:
        return None
    from lantern.backends.torch.kernels import triton_fused

    return triton_fused.rotary_write_kv(qk, v, cos, sin, k_pool, v_pool, slots)


def rms_norm(x, weight, eps: float, residual=None):
    if use_triton(x):
        from lantern.backends.torch.kernels import triton_fused

        return triton_fused.rms_norm(x, weight, eps, residual)
    if cpu_elementwise.serves(x):
        fused = cpu_elementwise.rms_norm(x, weight, eps, residual)
        if fused is not None:
            return fused
    return reference.rms_norm(x, weight, eps, residual)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor | None:
    """SiLU(gate) * up of gate_up [T, 2n] (gate first) in one pass where a native kernel takes it (Triton on
    CUDA, bf16 on a CPU, eager); None: the caller computes it with torch ops."""
    if use_triton(gate_up) and gate_up.dtype in (torch.bfloat16, torch.float16, torch.float32):
        from lantern.backends.torch.kernels import triton_fused

        return triton_fused.silu_mul(gate_up)
    return cpu_elementwise.silu_mul(gate_up) if cpu_elementwise.serves(gate_up) else None


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, step_cache: dict | None = None) -> torch.Tensor:
    """step_cache: a dict living for one step, where the CPU path keeps the signed tables it
    derives from (cos, sin) for the next layers."""
    if use_triton(x):
        from lantern.backends.torch.kernels import triton_fused

        return triton_fused.rotary(x, cos, sin)
    if cpu_elementwise.serves(x):
        fused = cpu_elementwise.rope(x, cos, sin)
        if fused is not None:
            return fused
    if step_cache is None:
        return reference.rotary(x, cos, sin)
    key = ("rope", id(cos), id(sin))
    hit = step_cache.get(key)
    if hit is None or hit[0] is not cos or hit[1] is not sin:  # the entry holds its tables: ids stay theirs
        hit = step_cache[key] = (cos, sin, *reference.signed_rope(cos, sin))
    return reference.rotary_signed(x, hit[2], hit[3])
