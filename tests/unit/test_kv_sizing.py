"""KV pool sizing by need, refusals that name the limit, and a CPU pool that costs memory only
where it is written."""

from __future__ import annotations

import pytest

from lantern.app.config import EngineConfig
from lantern.app.engine.kv_sizing import DEFAULT_TOKENS_PER_SEQ, PREFIX_CACHE_BUDGET_BYTES, plan_kv_cache


class FakeBackend:
    name = "fake"
    kv_memory_is_lazy = True

    def __init__(self, free_bytes: int, per_token: int = 1024):
        self.free_bytes, self.per_token = free_bytes, per_token

    def kv_bytes_per_block(self, block_size: int) -> int:
        return block_size * self.per_token

    def available_memory_bytes(self) -> int:
        return self.free_bytes


class Cfg:
    sliding_window = None
    dual_chunk_size = None
    max_context = 8192


def plan(free: int, **options):
    config = EngineConfig(model="unused", **options)
    return plan_kv_cache(config, Cfg(), 8192, FakeBackend(free))


def test_default_pool_is_sized_by_need_not_by_free_memory():
    p = plan(free=10**12, max_num_seqs=8)
    assert p.num_blocks * 16 == 8 * DEFAULT_TOKENS_PER_SEQ
    assert p.max_model_len == 8192


def test_default_pool_is_capped_by_a_share_of_free_memory():
    p = plan(free=16 * 2**20, max_num_seqs=256)  # 16 MiB free, 1 KiB a token
    assert p.num_blocks * 16 * 1024 == 0.25 * 16 * 2**20
    assert p.max_model_len == p.num_blocks * 16  # context capped to what fits, with a warning


def test_explicit_limits_that_cannot_be_met_are_refused():
    with pytest.raises(ValueError, match="max_model_len 100000 is beyond the 8192 positions"):
        plan(free=10**12, max_model_len=100_000)
    with pytest.raises(ValueError, match="does not fit the KV cache"):
        plan(free=10**12, max_model_len=8192, kv_cache_memory_mb=1)
    with pytest.raises(ValueError, match="kv_cache_memory_mb"):
        EngineConfig(model="unused", kv_cache_memory_mb=0)
    with pytest.raises(ValueError, match="kv_cache_memory_mb"):
        EngineConfig(model="unused", kv_cache_memory_mb=-1)


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def test_a_sliding_window_shorter_than_the_context_is_served():
    cfg = Cfg()
    cfg.sliding_window = 4096  # implemented by both backends' paged attention: no longer a limit
    assert plan_kv_cache(EngineConfig(model="unused"), cfg, 8192, FakeBackend(10**12)).max_model_len == 8192


def test_dual_chunk_attention_past_one_chunk_is_refused_naming_the_flag():
    cfg = Cfg()
    cfg.dual_chunk_size = 4096
    with pytest.raises(ValueError, match=r"dual_chunk_attention_config.chunk_size=4096 .* --max-model-len 4096"):
        plan_kv_cache(EngineConfig(model="unused"), cfg, 8192, FakeBackend(10**12))
    ok = plan_kv_cache(EngineConfig(model="unused", max_model_len=4096), cfg, 8192, FakeBackend(10**12))
    assert ok.max_model_len == 4096


def test_lazy_pools_get_a_prefix_cache_budget():
    p = plan(free=10**12, max_num_seqs=256)
    assert p.cache_budget_blocks * 16 * 1024 == PREFIX_CACHE_BUDGET_BYTES


def test_cpu_pool_is_committed_only_where_written():
    torch = pytest.importorskip("torch")
    from lantern.backends.torch.attention import TorchKVPool

    before = _rss_mib()
    pool = TorchKVPool(4, 2**20, 4, 32, torch.float32, torch.device("cpu"))  # 4 layers x 2 x 512 MiB
    assert _rss_mib() - before < 64
    assert float(pool.k[3][-1].abs().sum()) == 0.0  # reads as zeros
    pool.k[0][:16] = 1.0
    assert _rss_mib() - before < 64


def test_mlx_pool_grows_with_the_blocks_written_and_keeps_its_contents():
    mx = pytest.importorskip("mlx.core")
    from lantern.backends.mlx.paged_attention import PagedKVPool

    pool = PagedKVPool(2, 100_000 * 16, 2, 8, mx.float32, block_size=16)
    assert pool.num_slots == PagedKVPool.INITIAL_BLOCKS * 16  # not 1.6M slots up front
    first = mx.ones((3, 2, 8))
    pool.write(1, mx.array([0, 5, 17]), first, 2 * first)
    pool.reserve(5000)
    assert pool.num_slots >= 5000 and pool.num_slots % 16 == 0
    assert pool.num_slots < 10_000  # doubling, not the whole pool
    assert float(pool.k[1][5].sum()) == 16.0 and float(pool.v[1][17].sum()) == 32.0
    assert float(pool.k[0][4999].sum()) == 0.0
    pool.reserve(10**9)
    assert pool.num_slots == 100_000 * 16  # capped at the planned size
