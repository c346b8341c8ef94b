"""Every Triton kernel against its plain-torch reference.

On CPU the kernels run in Triton's interpreter (TRITON_INTERPRET=1, set before triton is imported,
see conftest.py); with a CUDA device the same tests run on the GPU (marked gpu).
Shapes are small (the interpreter costs ~1 ms per program) but cover several block sizes, head dims
64/128, GQA ratios 1/4/8, and chunk boundaries inside blocks.
"""

from __future__ import annotations

import pytest
import torch

from lantern.backends.torch.kernels import reference

triton_kernels = pytest.importorskip("lantern.backends.torch.kernels.triton_kernels")

DEVICES = ["cpu"] + [pytest.param("cuda", marks=pytest.mark.gpu)]


def device_ok(device: str) -> None:
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")


def make_pool(num_blocks, block_size, kvh, d, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(num_blocks * block_size, kvh, d, generator=g).to(device)
    v = torch.randn(num_blocks * block_size, kvh, d, generator=g).to(device)
    return k, v


def random_tables(batch, blocks_each, num_blocks, seed=0):
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(num_blocks, generator=g)
    return perm[: batch * blocks_each].view(batch, blocks_each).to(torch.int32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("d", [64, 128])
def test_write_kv(device, d):
    device_ok(device)
    k_pool, v_pool = make_pool(8, 4, 2, d, device)
    ref_k, ref_v = k_pool.clone(), v_pool.clone()
    k, v = torch.randn(5, 2, d, device=device), torch.randn(5, 2, d, device=device)
    slots = torch.tensor([3, 17, 0, 31, 8], device=device)
    triton_kernels.write_kv(k_pool, v_pool, k, v, slots)
    reference.write_kv(ref_k, ref_v, k, v, slots)
    assert torch.equal(k_pool, ref_k) and torch.equal(v_pool, ref_v)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "block_size,d,heads,kvh,num_splits",
    [
        (4, 64, 2, 2, 2),  # GQA ratio 1, several splits
        (4, 64, 4, 2, 8),  # more splits than a short sequence has blocks: empty splits
        (8, 64, 8, 2, 1),  # ratio 4, one split
        (16, 128, 8, 1, 8),  # ratio 8, head dim 128
        (4, 128, 4, 1, 3),  # ratio 4, uneven splits
    ],
)
@pytest.mark.parametrize("fold", [True, False])
def test_paged_decode(device, block_size, d, heads, kvh, num_splits, fold, monkeypatch):
    """fold: the partial kernel's last program of each (sequence, KV head) folds the splits (no reduce kernel),
    leaving the device's counters at zero for the next call; else the reduce kernel."""
    device_ok(device)
    num_blocks, batch, blocks_each = 24, 3, 5
    k_pool, v_pool = make_pool(num_blocks, block_size, kvh, d, device)
    tables = random_tables(batch, blocks_each, num_blocks).to(device)
    # Lengths end mid-block, on a block edge, and at one token.
    seq_lens = torch.tensor([blocks_each * block_size - 1, 2 * block_size, 1], dtype=torch.int32, device=device)
    q = torch.randn(batch, heads, d, device=device)
    scale = d**-0.5
    launches = []
    reduce_kernel = triton_kernels._decode_reduce_kernel
    real_run = reduce_kernel.run
    monkeypatch.setattr(reduce_kernel, "run", lambda *a, **kw: launches.append(1) or real_run(*a, **kw))
    ours = triton_kernels.paged_decode(
        q, k_pool, v_pool, tables, seq_lens, block_size, scale, num_splits=num_splits, fold=fold
    )
    ref = reference.paged_decode(q, k_pool, v_pool, tables, seq_lens, block_size, scale)
    torch.testing.assert_close(ours, ref, atol=2e-5, rtol=1e-4)
    assert len(launches) == (0 if fold else 1)
    if fold:
        assert not triton_kernels.fold_counters(q.device, batch * kvh).any()  # zero again: ready for the next call
        again = triton_kernels.paged_decode(
            q, k_pool, v_pool, tables, seq_lens, block_size, scale, num_splits=num_splits
        )
        assert torch.equal(again, ours)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "block_size,d,heads,kvh,q_len,ctx_len",
    [
        (4, 64, 2, 2, 7, 7),  # no prefix
        (4, 64, 4, 1, 5, 14),  # chunk starts inside a block
        (8, 128, 8, 1, 9, 21),  # GQA 8, head dim 128
        (16, 64, 8, 2, 20, 37),  # query blocks of 16 over two tiles
    ],
)
def test_paged_prefill(device, block_size, d, heads, kvh, q_len, ctx_len):
    device_ok(device)
    num_blocks = 16
    k_pool, v_pool = make_pool(num_blocks, block_size, kvh, d, device, seed=1)
    table = random_tables(1, -(-ctx_len // block_size), num_blocks, seed=2)[0].to(device)
    q = torch.randn(q_len, heads, d, device=device)
    scale = d**-0.5
    ours = triton_kernels.paged_prefill(q, k_pool, v_pool, table, ctx_len, block_size, scale)
    ref = reference.paged_prefill(q, k_pool, v_pool, table, ctx_len, block_size, scale)
    torch.testing.assert_close(ours, ref, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_half_precision_pool(device):
    device_ok(device)
    k_pool, v_pool = make_pool(12, 8, 2, 64, device)
    k_pool, v_pool = k_pool.half(), v_pool.half()
    tables = random_tables(2, 3, 12).to(device)
    seq_lens = torch.tensor([20, 9], dtype=torch.int32, device=device)
    q = torch.randn(2, 8, 64, device=device).half()
    ours = triton_kernels.paged_decode(q, k_pool, v_pool, tables, seq_lens, 8, 0.125)
    ref = reference.paged_decode(q.float(), k_pool.float(), v_pool.float(), tables, seq_lens, 8, 0.125)
    torch.testing.assert_close(ours.float(), ref, atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block_size", [4, 16])
def test_half_precision_prefill(device, block_size):
    """Prefill tiles run tl.dot on half inputs (P cast to half for the PV product)."""
    device_ok(device)
    k_pool, v_pool = make_pool(16, block_size, 2, 64, device, seed=3)
    k_pool, v_pool = k_pool.half(), v_pool.half()
    ctx_len, q_len = 45, 19
    table = random_tables(1, -(-ctx_len // block_size), 16, seed=4)[0].to(device)
    q = torch.randn(q_len, 8, 64, device=device).half()
    ours = triton_kernels.paged_prefill(q, k_pool, v_pool, table, ctx_len, block_size, 0.125)
    ref = reference.paged_prefill(q.float(), k_pool.float(), v_pool.float(), table, ctx_len, block_size, 0.125)
    torch.testing.assert_close(ours.float(), ref, atol=3e-3, rtol=3e-3)


def poison_blocks_before(k_pool, v_pool, tables, first_positions, block_size, window, poison_block):
    """Point every table column wholly before the window at one block filled with huge values, as
    the plan does with released (-1) blocks: any read of it that is not masked shows up."""
    k_pool[poison_block * block_size : (poison_block + 1) * block_size] = 1e3
    v_pool[poison_block * block_size : (poison_block + 1) * block_size] = 1e3
    for r, first_pos in enumerate(first_positions):
        dead = max(0, int(first_pos) - window + 1) // block_size  # blocks before the first query's window
        tables[r, :dead] = poison_block


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "block_size,window,softcap,sinks,num_splits",
    [
        (4, 6, None, False, 2),  # window not a multiple of the block size, several splits
        (4, 3, 5.0, True, 3),  # window shorter than a block, soft-cap and sinks
        (8, 9, None, True, 1),  # one split walks only the window's blocks
        (4, 100, 5.0, False, 4),  # window longer than every context: full attention
        (4, None, None, True, 2),  # sinks alone
    ],
)
def test_paged_decode_window_softcap_sinks(device, block_size, window, softcap, sinks, num_splits):
    device_ok(device)
    num_blocks, batch, blocks_each, heads, kvh, d = 24, 3, 5, 4, 2, 64
    k_pool, v_pool = make_pool(num_blocks, block_size, kvh, d, device, seed=5)
    tables = random_tables(batch, blocks_each, num_blocks - 1, seed=6).to(device) + 1  # block 0 stays free
    seq_lens = torch.tensor([blocks_each * block_size - 1, 2 * block_size + 1, 1], dtype=torch.int32, device=device)
    if window is not None and window < 100:
        poison_blocks_before(k_pool, v_pool, tables, seq_lens - 1, block_size, window, 0)
    q = torch.randn(batch, heads, d, device=device)
    sink = torch.randn(heads, device=device) * 2 if sinks else None
    kw = dict(window=window, softcap=softcap, sinks=sink)
    ref = reference.paged_decode(q, k_pool, v_pool, tables, seq_lens, block_size, 0.3, **kw)
    for fold in (True, False):  # the partial kernel's fold, and the reduce kernel
        ours = triton_kernels.paged_decode(
            q, k_pool, v_pool, tables, seq_lens, block_size, 0.3, num_splits=num_splits, fold=fold, **kw
        )
        torch.testing.assert_close(ours, ref, atol=2e-5, rtol=1e-4)
    if window is not None or sinks:  # the options change the result (the test could fail)
        plain = reference.paged_decode(q, k_pool, v_pool, tables, seq_lens, block_size, 0.3)
        assert not torch.allclose(ref, plain, atol=1e-3)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "block_size,q_len,ctx_len,window,softcap,sinks",
    [
        (4, 7, 7, 3, None, False),  # no prefix, window shorter than a block
        (4, 5, 14, 6, 5.0, True),  # chunk after a prefix, window reaching into it
        (8, 20, 37, 9, None, True),  # two query blocks: the second starts past the first window
        (16, 9, 21, 40, 5.0, False),  # window longer than the context, soft-cap only
    ],
)
def test_paged_prefill_window_softcap_sinks(device, block_size, q_len, ctx_len, window, softcap, sinks):
    device_ok(device)
    num_blocks, heads, kvh, d = 16, 2, 1, 64
    k_pool, v_pool = make_pool(num_blocks, block_size, kvh, d, device, seed=7)
    table = (random_tables(1, -(-ctx_len // block_size), num_blocks - 1, seed=8) + 1).to(device)
    if window < ctx_len:
        poison_blocks_before(k_pool, v_pool, table, [ctx_len - q_len], block_size, window, 0)
    q = torch.randn(q_len, heads, d, device=device)
    sink = torch.randn(heads, device=device) * 2 if sinks else None
    kw = dict(window=window, softcap=softcap, sinks=sink)
    ours = triton_kernels.paged_prefill(q, k_pool, v_pool, table[0], ctx_len, block_size, 0.3, **kw)
    ref = reference.paged_prefill(q, k_pool, v_pool, table[0], ctx_len, block_size, 0.3, **kw)
    torch.testing.assert_close(ours, ref, atol=2e-5, rtol=1e-4)
    plain = reference.paged_prefill(q, k_pool, v_pool, table[0], ctx_len, block_size, 0.3)
    assert not torch.allclose(ref, plain, atol=1e-3)


@pytest.mark.parametrize("device", DEVICES)
def test_half_precision_window_softcap_sinks(device):
    """The half-precision tl.dot tiles under a window, a soft-cap and sinks."""
    device_ok(device)
    k_pool, v_pool = make_pool(16, 4, 2, 64, device, seed=9)
    k_pool, v_pool = k_pool.half(), v_pool.half()
    ctx_len, q_len = 29, 18
    table = random_tables(1, -(-ctx_len // 4), 16, seed=10)[0].to(device)
    q = torch.randn(q_len, 4, 64, device=device).half()
    kw = dict(window=7, softcap=4.0, sinks=torch.randn(4, device=device))
    ours = triton_kernels.paged_prefill(q, k_pool, v_pool, table, ctx_len, 4, 0.125, **kw)
    ref = reference.paged_prefill(q.float(), k_pool.float(), v_pool.float(), table, ctx_len, 4, 0.125, **kw)
    torch.testing.assert_close(ours.float(), ref, atol=3e-3, rtol=3e-3)
