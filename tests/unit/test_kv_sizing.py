"""KV pool sizing by need, refusals that name the limit, and a CPU pool that costs memory only
where it is written."""

from __future__ import annotations

import logging

import pytest

from lantern.app.config import EngineConfig
from lantern.app.engine.kv_sizing import (
    DEFAULT_TOKENS_PER_SEQ,
    PREFIX_CACHE_BUDGET_BYTES,
    plan_kv_cache,
    seq_block_cap,
)


class FakeBackend:
    name = "fake"
    kv_memory_is_lazy = True

    def __init__(self, free_bytes: int, per_token: int = 1024):
        self.free_bytes, self.per_token = free_bytes, per_token

    def kv_bytes_per_block(self, block_size: int) -> int:
        return block_size * self.per_token

    def available_memory_bytes(self) -> int:
        return self.free_bytes

    def state_bytes_per_seq(self) -> int:
        return 0


class Cfg:
    sliding_window = None
    dual_chunk_size = None
    attention_chunk = None
    dense_limit = None
    max_context = 8192
    max_position_embeddings = 8192
    rope_scaling = None


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


# ---- every layer slides: a sequence's blocks are capped -----------------------------------------
class SlidingCfg(Cfg):
    def __init__(self, window: int, all_slide: bool = True):
        self.sliding_window, self.all_layers_slide = window, all_slide


def test_all_sliding_layers_cap_the_blocks_a_sequence_holds(caplog):
    import logging

    cfg = SlidingCfg(256)  # window 256, block 16, chunk 512: 1 + ceil((256 + 512 - 2) / 16) = 49 blocks
    assert seq_block_cap(EngineConfig(model="unused"), cfg) == 49
    assert seq_block_cap(EngineConfig(model="unused", prefill_chunk_size=1), cfg) == 1 + 16
    assert seq_block_cap(EngineConfig(model="unused", max_num_batched_tokens=64), cfg) == 1 + 20
    assert seq_block_cap(EngineConfig(model="unused"), SlidingCfg(256, all_slide=False)) is None
    assert seq_block_cap(EngineConfig(model="unused"), SlidingCfg(1)) is None  # see its docstring
    with caplog.at_level(logging.INFO, logger="lantern.app.engine.kv_sizing"):
        p = plan_kv_cache(EngineConfig(model="unused", max_num_seqs=8), cfg, 8192, FakeBackend(10**12))
    assert p.num_blocks == 8 * 49 and p.max_model_len == 8192  # not 8 x 2048 tokens, context not capped
    assert "a sequence holds at most 49 blocks" in caplog.text
    # A pool of one sequence's cap serves the whole context, even asked for explicitly ...
    one = plan_kv_cache(EngineConfig(model="unused", num_kv_blocks=49, max_model_len=8192), cfg, 8192, FakeBackend(0))
    assert one.max_model_len == 8192
    # ... one block less does not.
    with pytest.raises(ValueError, match="does not fit the KV cache"):
        plan_kv_cache(EngineConfig(model="unused", num_kv_blocks=48, max_model_len=8192), cfg, 8192, FakeBackend(0))
    # Some layer reading the whole context: the pool limits the context as before.
    full = plan_kv_cache(EngineConfig(model="unused", num_kv_blocks=49), SlidingCfg(256, False), 8192, FakeBackend(0))
    assert full.max_model_len == 49 * 16


def _run(sched, seqs, steps, on_step):
    from lantern.app.engine.sequence import SequenceStatus

    for s in seqs:
        sched.add(s)
    for _ in range(steps):
        out = sched.schedule()
        on_step()
        sched.after_step(out)
        for item in out.scheduled:
            s = item.seq
            if s.status is SequenceStatus.RUNNING and s.num_computed_tokens == s.num_tokens:
                s.append_token(5 + s.num_tokens % 7)
                if s.num_tokens - s.num_prompt_tokens >= s.params.max_tokens:
                    sched.finish(s, "length")
        if not sched.has_work:
            break


def _live(seq) -> int:
    return sum(1 for b in seq.block_table if b >= 0)


def _peak(window: int, bs: int, chunk: int, budget: int, prompts: list[int]) -> tuple[int, int]:
    """(cap, most blocks any sequence held) for prompts run together on a pool of their caps."""
    from lantern.app.engine.block_manager import BlockManager
    from lantern.app.engine.sampling_params import SamplingParams
    from lantern.app.engine.scheduler import Scheduler, SchedulerConfig
    from lantern.app.engine.sequence import Sequence

    config = EngineConfig(model="unused", block_size=bs, prefill_chunk_size=chunk, max_num_batched_tokens=budget)
    cap = seq_block_cap(config, SlidingCfg(window))
    bm = BlockManager(len(prompts) * cap, bs, release_window=window)
    sched = Scheduler(SchedulerConfig(len(prompts), budget, chunk), bm)
    params = SamplingParams(temperature=0, max_tokens=60)
    seqs = [Sequence(str(i), [i + 1] * n, params) for i, n in enumerate(prompts)]
    peak = [0]
    _run(sched, seqs, 2000, lambda: peak.__setitem__(0, max([peak[0]] + [_live(s) for s in seqs])))
    assert sched.num_preemptions == 0 and not sched.has_work
    return cap, peak[0]


@pytest.mark.parametrize(("window", "bs", "chunk"), [(8, 4, 6), (8, 4, 1), (16, 16, 17), (5, 2, 3)])
def test_the_cap_is_reached_by_one_sequence(window, bs, chunk):
    """Tight: a lone sequence's prefill chunks (or decode steps, chunk 1) reach the cap when one
    starts with n - W + 1 one short of a block boundary, so it is not an over-estimate."""
    cap, peak = _peak(window, bs, chunk, 2048, [window + (bs + 2) * chunk])
    assert peak == cap


def test_the_cap_is_reached_when_the_budget_cuts_chunks():
    """Chunks of a multiple of the block size never reach it alone (16 tokens of window, blocks of
    16, chunks of 64: 4 + 1 blocks at most), but a budget shared by two sequences starts chunks at
    other positions, which do: 1 + ceil((16 + 64 - 2) / 16) = 6."""
    assert _peak(16, 16, 64, 2048, [400]) == (6, 5)
    assert max(_peak(16, 16, 64, budget, [400, 400])[1] for budget in range(65, 100)) == 6


def test_a_pool_of_max_num_seqs_caps_never_preempts():
    """Sufficient: however the token budget cuts chunks (any phase), prefix hits included, no
    sequence holds more than the cap, so max_num_seqs x cap blocks never preempt anyone."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from lantern.app.engine.block_manager import BlockManager
    from lantern.app.engine.sampling_params import SamplingParams
    from lantern.app.engine.scheduler import Scheduler, SchedulerConfig
    from lantern.app.engine.sequence import Sequence

    @settings(max_examples=150, deadline=None)
    @given(
        window=st.integers(2, 40),
        bs=st.integers(1, 12),
        chunk=st.integers(1, 40),
        budget=st.integers(1, 64),
        prompts=st.lists(st.integers(1, 90), min_size=1, max_size=4),
        shared=st.booleans(),
    )
    def check(window, bs, chunk, budget, prompts, shared):
        config = EngineConfig(model="unused", block_size=bs, prefill_chunk_size=chunk, max_num_batched_tokens=budget)
        cap = seq_block_cap(config, SlidingCfg(window))
        bm = BlockManager(len(prompts) * cap, bs, release_window=window)
        sched = Scheduler(SchedulerConfig(len(prompts), budget, chunk), bm)
        params = SamplingParams(temperature=0, max_tokens=40)
        # shared: the prompts share a prefix, so later ones start from prefix-cache hits
        seqs = [Sequence(str(i), [1 + (0 if shared else i)] * n + [i], params) for i, n in enumerate(prompts)]

        def on_step():
            assert all(_live(s) <= cap for s in seqs), [(_live(s), cap) for s in seqs]

        _run(sched, seqs, 2000, on_step)
        assert sched.num_preemptions == 0
        assert not sched.has_work

    check()


@pytest.mark.parametrize("backend", ["mlx", "torch"])
def test_a_pool_of_one_cap_serves_the_whole_context_on_a_real_model(tiny_model_dir, backend):
    """mistral_swa slides on every layer (window 8): with blocks of 4 and chunks of 8 a sequence
    holds at most 5 blocks, so a 5-block pool (20 tokens) generates 120-token answers with the same
    greedy tokens as a pool with room for every token (256 blocks)."""
    pytest.importorskip(backend if backend == "torch" else "mlx.core")
    from lantern.app.engine import LLM, SamplingParams

    opts = dict(backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, max_num_seqs=2)
    params = SamplingParams(temperature=0, max_tokens=120, ignore_eos=True)
    prompts = ["Paged attention keeps the cache in blocks of tokens", "def add(a, b):"]
    small = LLM(tiny_model_dir("mistral_swa"), num_kv_blocks=10, **opts)  # 2 sequences x 5 blocks
    assert seq_block_cap(small.engine.config, small.engine.model_config) == 5
    assert small.engine.max_model_len == 256  # not capped at the pool's 40 tokens
    got = [o.outputs[0].token_ids for o in small.generate(prompts, params)]
    assert small.engine.scheduler.num_preemptions == 0
    big = LLM(tiny_model_dir("mistral_swa"), num_kv_blocks=256, **opts)
    assert got == [o.outputs[0].token_ids for o in big.generate(prompts, params)]
    assert all(len(t) == 120 for t in got)


class StateBackend(FakeBackend):
    """A model with linear-attention layers: each running sequence holds `per_seq` bytes of state."""

    def __init__(self, free_bytes: int, per_seq: int):
        super().__init__(free_bytes)
        self.per_seq = per_seq

    def state_bytes_per_seq(self) -> int:
        return self.per_seq


def test_recurrent_state_lowers_max_num_seqs_to_half_the_share(caplog):
    config = EngineConfig(model="unused", max_num_seqs=256, gpu_memory_fraction=0.5, enable_prefix_caching=False)
    # 16 GiB free, half of it the share, half of that for the state: 4 GiB / 150 MiB -> 27 sequences
    with caplog.at_level(logging.INFO):
        p = plan_kv_cache(config, Cfg(), 8192, StateBackend(16 * 2**30, 150 * 2**20))
    assert (p.max_num_seqs, p.state_snapshots) == (27, 0)
    assert "max_num_seqs lowered from 256 to 27" in caplog.text
    # the pool gets what the state leaves of the share
    assert p.num_blocks * config.block_size * 1024 <= 8 * 2**30 - 27 * 150 * 2**20
    no_cache = EngineConfig(model="unused", max_num_seqs=4, enable_prefix_caching=False)
    small = plan_kv_cache(no_cache, Cfg(), 8192, StateBackend(16 * 2**30, 2**20))
    assert (small.max_num_seqs, small.state_snapshots) == (4, 0)


def test_prefix_cache_snapshots_of_the_state_are_sized_within_the_same_half(caplog):
    config = EngineConfig(model="unused", max_num_seqs=256, gpu_memory_fraction=0.5)
    # 27 states fit; the default snapshots are what 512 MiB holds (3 of 150 MiB), the running sequences the rest
    with caplog.at_level(logging.INFO):
        p = plan_kv_cache(config, Cfg(), 8192, StateBackend(16 * 2**30, 150 * 2**20))
    assert (p.max_num_seqs, p.state_snapshots) == (24, 3)
    assert "450.0 MiB for 3 prefix-cache snapshots" in caplog.text
    assert p.num_blocks * config.block_size * 1024 <= 8 * 2**30 - 27 * 150 * 2**20
    # a small state: as many snapshots as sequences (the budget would hold more); a huge one: at least 2
    small = plan_kv_cache(EngineConfig(model="unused", max_num_seqs=4), Cfg(), 8192, StateBackend(16 * 2**30, 2**20))
    assert (small.max_num_seqs, small.state_snapshots) == (4, 4)
    big = plan_kv_cache(EngineConfig(model="unused", max_num_seqs=4), Cfg(), 8192, StateBackend(64 * 2**30, 2**30))
    assert (big.max_num_seqs, big.state_snapshots) == (4, 2)
    # asked for: kept while everything fits, else cut to half of the room with a warning
    asked = EngineConfig(model="unused", max_num_seqs=8, prefix_cache_states=20, gpu_memory_fraction=0.5)
    assert plan_kv_cache(asked, Cfg(), 8192, StateBackend(16 * 2**30, 100 * 2**20)).state_snapshots == 20
    with caplog.at_level(logging.WARNING):
        cut = plan_kv_cache(asked, Cfg(), 8192, StateBackend(16 * 2**30, 150 * 2**20))
    assert (cut.max_num_seqs, cut.state_snapshots) == (8, 13)
    assert "--prefix-cache-states lowered from 20 to 13" in caplog.text
    # one state's room only: the running sequence keeps it, no snapshot
    one = plan_kv_cache(EngineConfig(model="unused"), Cfg(), 8192, StateBackend(4 * 2**30, 2**29))
    assert (one.max_num_seqs, one.state_snapshots) == (1, 0)
    off = EngineConfig(model="unused", max_num_seqs=8, prefix_cache_states=0)
    assert plan_kv_cache(off, Cfg(), 8192, StateBackend(16 * 2**30, 2**20)).state_snapshots == 0


def test_a_state_too_big_for_one_sequence_is_refused_naming_the_flag():
    with pytest.raises(ValueError, match="gpu-memory-fraction"):
        plan_kv_cache(EngineConfig(model="unused"), Cfg(), 8192, StateBackend(2**30, 2**30))
