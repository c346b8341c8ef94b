"""Paged KV pool and paged attention in plain torch: the CPU path and the reference for kernels.

Layout matches the MLX backend: per layer one pool [num_blocks * block_size, kv_heads, head_dim]
for K and one for V; writes go to `slot_mapping`, reads gather context slots from the shared
numpy plan (backends/paged_plan.py). Each op is a Triton kernel on CUDA and its plain-torch
reference elsewhere (kernels/ops.py); on a CPU with the native kernels, decode rows over a float32
or bfloat16 pool read it in place (cpu_attention.py) instead of gathering it.

A pool built with v_is_k_prefix (multi-head latent attention, backends/base.KVLayout) stores K
only: each layer's `v` is a view of K's first v_dim columns, writes pass v=None, and reads of a V
narrower than K take the plain-torch reference path (also on CUDA: the Triton kernels assume one
head size for K and V).
"""

from __future__ import annotations

import math
import mmap
from dataclasses import dataclass, field

import torch

from lantern.app.engine.contract import ScheduledBatch
from lantern.backends.paged_plan import AttentionPlan
from lantern.backends.torch import cpu_attention
from lantern.backends.torch.kernels import ops, reference


def lazy_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Zeros; on a CPU in an anonymous mapping of its own, which the OS backs with pages only where
    written (torch.zeros writes every byte), so an unused KV pool costs no resident memory. Not
    through malloc: once cpu_malloc has raised the mmap threshold, calloc would serve a pool below
    it from the heap and zero every byte."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    mapping = mmap.mmap(-1, nbytes)
    # Transparent huge pages where the OS grants them on request (THP "madvise", the usual setting):
    # decode attention reads every row's blocks scattered over the pool, and with 4 KiB pages a
    # 32-row SmolLM2 step spent ~15-20% of its attention time on TLB misses. Memory is still backed
    # only where written, in 2 MiB steps.
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            mapping.madvise(mmap.MADV_HUGEPAGE)
        except OSError:
            pass
    # The tensor keeps the mapping alive (frombuffer holds a reference to it).
    return torch.frombuffer(mapping, dtype=torch.uint8).view(dtype).view(shape)


class TorchKVPool:
    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        v_dim: int | None = None,
        v_is_k_prefix: bool = False,
        layer_shapes: list[tuple[int, int]] | None = None,
    ):
        """head_dim is K's width, v_dim V's (default head_dim). v_is_k_prefix: V is K[..., :v_dim]
        (self.v holds views of self.k, no memory of their own). layer_shapes: each layer's own
        (kv heads, head dim) for K and V alike, where layers differ (Gemma 4)."""
        self.v_dim = head_dim if v_dim is None else v_dim
        # Decode rows read this pool in place (cpu_attention's kernel) rather than gathering it.
        self.native_decode = cpu_attention.serves(dtype, device)
        self.v_is_k_prefix = v_is_k_prefix
        if layer_shapes is not None:
            self.k = [lazy_zeros((num_slots, h, d), dtype, device) for h, d in layer_shapes]
            self.v = [lazy_zeros((num_slots, h, d), dtype, device) for h, d in layer_shapes]
            return
        self.k = [lazy_zeros((num_slots, kv_heads, head_dim), dtype, device) for _ in range(num_layers)]
        if v_is_k_prefix:
            self.v = [k[..., : self.v_dim] for k in self.k]
        else:
            self.v = [lazy_zeros((num_slots, kv_heads, self.v_dim), dtype, device) for _ in range(num_layers)]


@dataclass
class PrefillGroup:
    q_start: int
    q_end: int
    block_table: torch.Tensor  # no negative (released) entries: the plan maps them to block 0
    ctx_len: int
    has_prefix: bool  # False: the chunk is the whole context, attend to its own K/V directly
    state_slot: int = -1  # the sequence's recurrent-state slot (models with linear-attention layers)


@dataclass
class TorchAttentionMetadata:
    pool: TorchKVPool
    block_size: int
    slot_mapping: torch.Tensor  # [T] int64
    cos: torch.Tensor  # [T, D] at each token's position
    sin: torch.Tensor
    decode_token_idx: torch.Tensor | None = None
    decode_block_tables: torch.Tensor | None = None  # [B, max_blocks] int32, no negative (released) entries
    decode_seq_lens: torch.Tensor | None = None  # [B] int32
    prefills: list[PrefillGroup] = field(default_factory=list)
    restore_order: torch.Tensor | None = None
    positions: torch.Tensor | None = None  # [T] int64: models with their own rope tables index them
    decode_only: bool = False  # every token is a decode row, in order (q needs no reordering)
    may_skip_slots: bool = True  # False: no slot in slot_mapping is negative (padding)
    native_decode: bool = False  # the pool's native_decode (compiled layers pass it as a graph input)
    # Values derived from this step's inputs that every layer would otherwise recompute (the
    # decode gather per window, rope views): the first layer that needs one stores it.
    step_cache: dict = field(default_factory=dict)
    # Inside a compiled decode layer (compiled_decode.py): this layer's (K, V) pool tensors, so that
    # the graph does not index the pool by layer number (every number would be a graph of its own).
    layer_kv: tuple | None = None
    # Models with recurrent layers: each decode row's state slot, and whether its state starts from
    # zeros (a one-token prompt: the row is position 0).
    decode_state_slots: torch.Tensor | None = None  # [B] int64
    decode_state_fresh: torch.Tensor | None = None  # [B] bool

    @property
    def rope_cache(self) -> dict | None:
        """Where rope keeps its per-step tables: none inside a compiled layer, whose graph fuses
        rope's ops anyway (and would be traced again for each step's new table ids)."""
        return None if self.layer_kv is not None else self.step_cache


def build_metadata(
    pool: TorchKVPool, batch: ScheduledBatch, plan: AttentionPlan, cos_table: torch.Tensor, sin_table: torch.Tensor
) -> TorchAttentionMetadata:
    dev = cos_table.device
    as_t = lambda a, dtype=torch.long: torch.from_numpy(a).to(dev, dtype)
    positions = as_t(batch.positions)
    meta = TorchAttentionMetadata(
        pool, batch.block_size, as_t(batch.slot_mapping), cos_table[positions], sin_table[positions]
    )
    meta.positions = positions
    meta.may_skip_slots = bool((batch.slot_mapping < 0).any())
    meta.native_decode = pool.native_decode
    if plan.decode_token_idx is not None:
        meta.decode_token_idx = as_t(plan.decode_token_idx)
        meta.decode_block_tables = as_t(plan.decode_block_tables, torch.int32)
        meta.decode_seq_lens = as_t(plan.decode_seq_lens, torch.int32)
        meta.decode_only = len(plan.decode_token_idx) == len(batch.positions) and plan.restore_order is None
    held = batch.state_slots
    if held is not None and plan.decode_seqs is not None:
        meta.decode_state_slots = as_t(held[plan.decode_seqs])
        meta.decode_state_fresh = as_t(plan.decode_seq_lens == 1, torch.bool)
    for g in plan.prefills:
        slot = -1 if held is None else int(held[g.seq_index])
        table = as_t(g.block_table, torch.int32)
        meta.prefills.append(PrefillGroup(g.q_start, g.q_end, table, g.ctx_len, g.context_slots is not None, slot))
    if plan.restore_order is not None:
        meta.restore_order = as_t(plan.restore_order)
    return meta


def layer_pools(meta: TorchAttentionMetadata, layer: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The (K, V) pool tensors layer `layer` writes this step (V None: it lies inside K, written with it)."""
    pool = meta.pool
    k_pool, v_pool = meta.layer_kv if meta.layer_kv is not None else (pool.k[layer], pool.v[layer])
    return k_pool, None if pool.v_is_k_prefix else v_pool


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor | None,
    meta: TorchAttentionMetadata,
    layer: int,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    write: bool = True,
    alibi: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [T, H, D], k/v [T, KVH, D] for this step's tokens -> attention output [T, H, D].

    write False: k/v are already in layer `layer` of the pool (a Gemma 4 layer reading the K/V of an
    earlier one passes that layer's number and its k/v of this step).

    window: a query at position p sees keys p - window < j <= p; softcap: scores (after scale)
    become softcap * tanh(scores / softcap) before masking; sinks [H]: one extra logit per head
    in the softmax's denominator, with no value (gpt-oss); alibi [H]: ALiBi's slopes (BLOOM), which the
    reference kernels compute (not the native CPU or Triton ones). Decode queries sit at seq_len - 1, a
    prefill chunk's first query at ctx_len - chunk length.

    With a pool whose V lies inside K (v_is_k_prefix), v is None and the output is [T, H, v_dim]."""
    pool = meta.pool
    k_pool, v_pool = meta.layer_kv if meta.layer_kv is not None else (pool.k[layer], pool.v[layer])
    if write and pool.v_is_k_prefix:
        ops.write_kv(k_pool, None, k, None, meta.slot_mapping, meta.may_skip_slots)
    elif write:
        ops.write_kv(k_pool, v_pool, k, v, meta.slot_mapping, meta.may_skip_slots)
    extras = dict(window=window, softcap=softcap, sinks=sinks)
    if alibi is not None:
        extras["alibi"] = alibi
    pieces = []
    if meta.decode_token_idx is not None:
        pieces.append(
            ops.paged_decode(
                q if meta.decode_only else q[meta.decode_token_idx],
                k_pool,
                v_pool,
                meta.decode_block_tables,
                meta.decode_seq_lens,
                meta.block_size,
                scale,
                **extras,
                ctx_cache=meta.step_cache,
                native=meta.native_decode,
            )
        )
    if meta.prefills and meta.native_decode and alibi is None and cpu_attention.serves_prefill(q, k_pool, v_pool):
        # A CPU step's prefill chunks in one native call (cpu_prefill_attention.c: ~2-3x faster than SDPA per chunk)
        groups = meta.step_cache.get("prefill_groups")
        if groups is None:
            groups = meta.step_cache["prefill_groups"] = cpu_attention.prefill_groups(meta.prefills, q.device)
        pieces.append(cpu_attention.paged_prefill(q, k_pool, v_pool, groups, meta.block_size, scale, **extras))
    else:
        for g in meta.prefills:
            qp = q[g.q_start : g.q_end]
            if g.has_prefix:
                pieces.append(
                    ops.paged_prefill(qp, k_pool, v_pool, g.block_table, g.ctx_len, meta.block_size, scale, **extras)
                )
            else:
                kp = k[g.q_start : g.q_end]
                vp = kp[..., : pool.v_dim] if pool.v_is_k_prefix else v[g.q_start : g.q_end]
                pieces.append(reference.causal_attention(qp, kp, vp, scale, **extras))
    out = pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=0)
    if meta.restore_order is not None:
        out = out[meta.restore_order]
    return out
