"""Ops of the torch backend: Triton kernels on CUDA, their plain-torch references elsewhere."""

from __future__ import annotations

import importlib.util
import os

import torch

from lantern.backends.torch.kernels import reference

_HAS_TRITON = importlib.util.find_spec("triton") is not None


def use_triton(t: torch.Tensor) -> bool:
    if os.environ.get("LANTERN_DISABLE_TRITON") == "1":
        return False
    return _HAS_TRITON and t.is_cuda


def _same_width(k_pool, v_pool) -> bool:
    """False for multi-head latent attention's V (K's first columns): the Triton kernels take one
    head size for K and V, so such pools take the reference path."""
    return v_pool is not None and k_pool.shape[-1] == v_pool.shape[-1]


def write_kv(k_pool, v_pool, k, v, slots) -> None:
    """v_pool and v None: a pool whose V lies inside K (only K is written)."""
    if use_triton(k) and v_pool is not None:
        from lantern.backends.torch.kernels import triton_kernels

        return triton_kernels.write_kv(k_pool, v_pool, k, v, slots)
    return reference.write_kv(k_pool, v_pool, k, v, slots)


def paged_decode(
    q, k_pool, v_pool, block_tables, seq_lens, block_size: int, scale: float, window=None, softcap=None, sinks=None
):
    if use_triton(q) and _same_width(k_pool, v_pool):
        from lantern.backends.torch.kernels import triton_kernels

        return triton_kernels.paged_decode(
            q, k_pool, v_pool, block_tables, seq_lens, block_size, scale, window=window, softcap=softcap, sinks=sinks
        )
    return reference.paged_decode(q, k_pool, v_pool, block_tables, seq_lens, block_size, scale, window, softcap, sinks)


def paged_prefill(
    q, k_pool, v_pool, block_table, ctx_len: int, block_size: int, scale: float, window=None, softcap=None, sinks=None
):
    if use_triton(q) and _same_width(k_pool, v_pool):
        from lantern.backends.torch.kernels import triton_kernels

        return triton_kernels.paged_prefill(
            q, k_pool, v_pool, block_table, ctx_len, block_size, scale, window=window, softcap=softcap, sinks=sinks
        )
    return reference.paged_prefill(q, k_pool, v_pool, block_table, ctx_len, block_size, scale, window, softcap, sinks)


def rms_norm(x, weight, eps: float, residual=None):
    if use_triton(x):
        from lantern.backends.torch.kernels import triton_fused

        return triton_fused.rms_norm(x, weight, eps, residual)
    return reference.rms_norm(x, weight, eps, residual)


def rotary(x, cos, sin):
    if use_triton(x):
        from lantern.backends.torch.kernels import triton_fused

        return triton_fused.rotary(x, cos, sin)
    return reference.rotary(x, cos, sin)
