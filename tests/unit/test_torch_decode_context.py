"""The CPU decode attention (reference.paged_decode with a step's DecodeContext) and the signed rope
tables, against plain per-sequence attention / reference.rotary written out here."""

from __future__ import annotations

import math

import pytest
import torch

from lantern.backends.torch.kernels import ops, reference

BS = 4  # block size


def _pools(blocks: int, kvh: int, d: int, dtype: torch.dtype, seed: int, dv: int | None = None):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(blocks * BS, kvh, d, generator=g).to(dtype)
    if dv == "mla":
        return k, k[..., : d // 2]  # V is K's first columns (multi-head latent attention)
    return k, torch.randn(blocks * BS, kvh, dv or d, generator=g).to(dtype)


def _naive(q, k_pool, v_pool, tables, lens, scale, window=None, softcap=None, sinks=None):
    """Row by row, position by position: the keys p - window < j <= p of each sequence."""
    b, h, _ = q.shape
    kvh = k_pool.shape[1]
    out = torch.empty(b, h, v_pool.shape[-1], dtype=torch.float64)
    for r in range(b):
        n = int(lens[r])
        lo = 0 if window is None else max(0, n - window)
        slots = torch.tensor([int(tables[r, j // BS]) * BS + j % BS for j in range(lo, n)])
        k, v = k_pool[slots].double(), v_pool[slots].double()
        for head in range(h):
            s = k[:, head // (h // kvh)] @ q[r, head].double() * scale
            if softcap is not None:
                s = torch.tanh(s / softcap) * softcap
            if sinks is not None:
                s = torch.cat([s, sinks[head : head + 1].double()])
            p = torch.softmax(s, 0)[: n - lo]
            out[r, head] = p @ v[:, head // (h // kvh)]
    return out


CASES = [  # window, softcap, sinks, v
    (None, None, False, None),
    (5, None, False, None),
    (None, 2.0, False, None),
    (6, None, True, None),
    (None, None, False, "mla"),
    (7, None, False, "mla"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window,softcap,sinks,dv", CASES)
def test_paged_decode_matches_plain_attention(dtype, window, softcap, sinks, dv) -> None:
    kvh, g, d = 2, 3, 16
    k_pool, v_pool = _pools(12, kvh, d, dtype, seed=1, dv=dv)
    lens = torch.tensor([1, 9, 13, 4], dtype=torch.int32)  # rows of 1, 3, 4, 1 blocks
    tables = torch.tensor([[5, 0, 0, 0], [2, 7, 1, 0], [3, 8, 9, 11], [10, 0, 0, 0]], dtype=torch.int32)
    q = torch.randn(4, kvh * g, d, generator=torch.Generator().manual_seed(2)).to(dtype)
    sink = torch.randn(kvh * g) if sinks else None
    kw = dict(window=window, softcap=softcap, sinks=sink)
    got = reference.paged_decode(q, k_pool, v_pool, tables, lens, BS, 0.3, **kw)
    want = _naive(q, k_pool, v_pool, tables, lens, 0.3, **kw)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    assert got.dtype == dtype and got.shape == want.shape
    torch.testing.assert_close(got.double(), want, atol=tol, rtol=tol)


@pytest.mark.parametrize("dv", [None, "mla"])
@pytest.mark.parametrize("window", [None, 6])
@pytest.mark.parametrize("table,in_place", [([3, 4, 5, 6], True), ([4, 3, 5, 6], False), ([9, 0, 0, 0], True)])
def test_a_lone_row_on_consecutive_blocks_reads_the_pool_in_place(table, in_place, window, dv) -> None:
    """One decode row whose blocks follow each other: the keys are a view of the pool (no copy per
    layer), with the same result as the gather; blocks out of order take the gather."""
    kvh, d = 2, 16
    k_pool, v_pool = _pools(12, kvh, d, torch.float32, seed=3, dv=dv)
    n = 13 if table[1] else 3
    lens, tables = torch.tensor([n], dtype=torch.int32), torch.tensor([table], dtype=torch.int32)
    q = torch.randn(1, 3 * kvh, d, generator=torch.Generator().manual_seed(4))
    ctx = reference.decode_context(tables, lens, BS, window)
    assert (ctx.first_slot is not None) == in_place
    if in_place:
        assert ctx.gather(k_pool, "k").data_ptr() == k_pool[ctx.first_slot :].data_ptr()  # a view
    got = reference.paged_decode(q, k_pool, v_pool, tables, lens, BS, 0.3, window=window, ctx=ctx)
    want = _naive(q, k_pool, v_pool, tables, lens, 0.3, window=window)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dv", [None, "mla"])
def test_a_shared_context_serves_every_layer_and_outputs_survive_the_next_gather(dv) -> None:
    """The step's gather buffers are reused layer after layer: an earlier layer's output must not
    view them (it would change under the next layer's gather)."""
    kvh, d = 2, 8
    lens = torch.tensor([6, 3, 11], dtype=torch.int32)
    tables = torch.tensor([[1, 4, 0], [2, 0, 0], [5, 3, 6]], dtype=torch.int32)
    cache: dict = {}
    outs, wants = [], []
    for layer in range(3):
        k_pool, v_pool = _pools(8, kvh, d, torch.float32, seed=10 + layer, dv=dv)
        # q as layers.Attention hands it over in a decode-only step: a strided view of fused q, k
        qk = torch.randn(3, 3 * kvh, d, generator=torch.Generator().manual_seed(layer))
        q = qk[:, : 2 * kvh]
        for window in (None, 4):
            outs.append(ops.paged_decode(q, k_pool, v_pool, tables, lens, BS, 0.5, window=window, ctx_cache=cache))
            wants.append(_naive(q, k_pool, v_pool, tables, lens, 0.5, window=window))
    assert set(cache) == {("decode", None), ("decode", 4)}  # one gather plan per window
    for got, want in zip(outs, wants, strict=True):
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def test_static_decode_padding_rows_read_block_zero_and_stay_finite() -> None:
    """The graph runner pads with length 1 over block 0 and slot -1: written nowhere, read finite."""
    k_pool, v_pool = _pools(4, 1, 8, torch.float32, seed=3)
    before = k_pool.clone()
    k = torch.randn(3, 1, 8)
    slots = torch.tensor([9, -1, -1])
    reference.write_kv(k_pool, v_pool, k, k, slots)  # may_skip: the default
    assert torch.equal(k_pool[9], k[0]) and torch.equal(k_pool[:9], before[:9])
    lens = torch.tensor([10, 1, 1], dtype=torch.int32)
    tables = torch.tensor([[0, 2, 1], [0, 0, 0], [0, 0, 0]], dtype=torch.int32)
    out = reference.paged_decode(torch.randn(3, 2, 8), k_pool, v_pool, tables, lens, BS, 0.3, window=3)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_signed_rope_tables_rotate_q_and_k_in_one_call(dtype, monkeypatch) -> None:
    """rotary_signed on a view of q and k side by side in a fused qkv row (as layers.Attention
    passes them) equals reference.rotary on q and on k alone; the step cache keys by table. (The
    torch path: bf16 on an AVX-512 CPU otherwise takes cpu_elementwise's rope, tested on its own.)"""
    from lantern.backends.torch import cpu_elementwise

    monkeypatch.setattr(cpu_elementwise, "serves", lambda x: False)
    t, h, kvh, d = 5, 4, 2, 8
    qkv = torch.randn(t, (h + 2 * kvh) * d).to(dtype)
    qk = qkv[:, : (h + kvh) * d].view(t, h + kvh, d)  # rows strided by the whole qkv width
    ang = torch.randn(t, d // 2).repeat(1, 2)
    cos, sin = ang.cos(), ang.sin()
    cache: dict = {}
    both = ops.rotary(qk, cos, sin, cache)
    q, k = qk[:, :h].contiguous(), qk[:, h:].contiguous()
    tol = dict(atol=1e-2, rtol=1e-2) if dtype == torch.bfloat16 else dict(atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(both[:, :h], reference.rotary(q, cos, sin), **tol)
    torch.testing.assert_close(both[:, h:], reference.rotary(k, cos, sin), **tol)
    cos2, sin2 = (2 * ang).cos(), (2 * ang).sin()  # a second table in the same step (Gemma 3's local rope)
    torch.testing.assert_close(ops.rotary(q, cos2, sin2, cache), reference.rotary(q, cos2, sin2), **tol)
    assert len(cache) == 2
    assert math.isclose(float(both.float().norm()), float(qk.float().norm()), rel_tol=1e-2)  # a rotation


# -- the step flags build_metadata sets (decode_only, may_skip_slots) ------------------------------------


def _batch(q_lens: list[int], ctx_lens: list[int], slots: list[int]):
    import numpy as np

    from lantern.app.engine.contract import ScheduledBatch

    starts = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    positions = np.concatenate([np.arange(c - q, c) for q, c in zip(q_lens, ctx_lens)]).astype(np.int32)
    tables = [list(range(i * 4, i * 4 + math.ceil(c / BS))) for i, c in enumerate(ctx_lens)]
    return ScheduledBatch(
        input_ids=np.arange(len(positions), dtype=np.int32),
        positions=positions,
        query_start_loc=starts,
        seq_lens=np.array(ctx_lens, np.int32),
        block_tables=tables,
        slot_mapping=np.array(slots, np.int32),
        block_size=BS,
        sample_seq_indices=list(range(len(q_lens))),
        sampling=[],
    )


def _meta(batch):
    from lantern.backends.paged_plan import plan_attention
    from lantern.backends.torch.attention import TorchKVPool, build_metadata

    pool = TorchKVPool(1, 64 * BS, 1, 8, torch.float32, torch.device("cpu"))
    cos, sin = torch.ones(64, 8), torch.zeros(64, 8)
    return build_metadata(pool, batch, plan_attention(batch), cos, sin)


def test_decode_only_and_slot_flags():
    decode = _meta(_batch([1, 1], [5, 3], [4, 18]))
    assert decode.decode_only and not decode.may_skip_slots
    mixed = _meta(_batch([3, 1], [3, 6], [0, 1, 2, 21]))  # a prefill chunk first, then a decode row
    assert not mixed.decode_only and mixed.decode_token_idx.tolist() == [3]
    padded = _meta(_batch([1, 1], [5, 3], [4, -1]))
    assert padded.may_skip_slots


def test_a_negative_slot_writes_nothing_and_others_land():
    from lantern.backends.torch.attention import paged_attention

    meta = _meta(_batch([1, 1], [5, 3], [4, -1]))
    pool = meta.pool
    before = pool.k[0].clone()
    k = torch.full((2, 1, 8), 7.0)
    paged_attention(torch.ones(2, 1, 8), k, k.clone(), meta, 0, 1.0)
    changed = (pool.k[0] != before).any(dim=(1, 2)).nonzero().flatten().tolist()
    assert changed == [4]  # only the real row's slot; -1 did not wrap to the pool's last slot


@pytest.mark.parametrize("shape", [(1, 576), (3, 4, 64), (300, 2048)])
def test_float32_rms_norm_is_hf_llamas_formula_bit_for_bit(shape):
    """reference.rms_norm's float32 path calls torch's rms_norm for speed; it must round exactly as
    HF Llama's weight * (h * rsqrt(mean(h^2) + eps)) does on a CPU, residual sum included."""
    g = torch.Generator().manual_seed(shape[-1])
    x, residual = torch.randn(*shape, generator=g) * 3, torch.randn(*shape, generator=g)
    weight = torch.randn(shape[-1], generator=g)
    normed, summed = reference.rms_norm(x, weight, 1e-6, residual)
    h = x + residual
    assert torch.equal(summed, h)
    assert torch.equal(normed, weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)))
