"""Property-based block accounting: scheduler + block manager under random add/abort/finish.

No model: tokens are invented. After every operation each block's ref count must equal the number of
live block tables holding it, free blocks must be exactly those with no references, and at the end
every block must be free. Every write a step schedules lands in a block only its sequence holds
(which is why the engine needs no copy-on-write), and salted prompts never share blocks.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from lantern.app.engine.block_manager import BlockManager
from lantern.app.engine.sampling_params import SamplingParams
from lantern.app.engine.scheduler import Scheduler, SchedulerConfig
from lantern.app.engine.sequence import Sequence, SequenceStatus

PARAMS = SamplingParams(temperature=0, max_tokens=64)

ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 3), st.integers(1, 40)),  # prefix id, suffix length
        st.tuples(st.just("step"), st.integers(0, 2**16), st.integers(0, 0)),
        st.tuples(st.just("finish"), st.integers(0, 50), st.integers(0, 0)),
        st.tuples(st.just("salted"), st.integers(0, 3), st.integers(1, 40)),  # same prompts, another tenant
    ),
    min_size=1,
    max_size=80,
)


def check_invariants(bm: BlockManager, live: list[Sequence]) -> None:
    held = Counter(b for s in live for b in s.block_table)
    for block in range(bm.num_blocks):
        assert bm.ref_counts[block] >= 0
        assert bm.ref_counts[block] == held.get(block, 0), f"block {block}"
        assert (block in bm.free or block in bm.fresh) == (bm.ref_counts[block] == 0)
    for h, block in bm.cached.items():
        assert bm.block_hash[block] == h
    for s in live:
        if s.status is not SequenceStatus.RUNNING:
            assert not s.block_table  # waiting sequences (new or preempted) hold nothing


@settings(max_examples=150, deadline=None)
@given(
    ops=ops,
    num_blocks=st.integers(8, 40),
    block_size=st.sampled_from([1, 2, 4]),
    chunk=st.integers(1, 16),
    caching=st.booleans(),
    touched=st.booleans(),
)
def test_no_block_leaked_or_double_freed(ops, num_blocks, block_size, chunk, caching, touched):
    bm = BlockManager(num_blocks, block_size, enable_prefix_caching=caching, prefer_touched=touched)
    sched = Scheduler(
        SchedulerConfig(max_num_seqs=6, max_num_batched_tokens=24, prefill_chunk_size=chunk),
        bm,
    )
    prefixes = [[100 + p] * 12 for p in range(4)]
    live: list[Sequence] = []
    for kind, a, b in ops:
        if kind in ("add", "salted"):
            prompt = (prefixes[a] + list(range(b)))[: max(1, num_blocks * block_size // 2)]
            seq = Sequence("r", prompt, PARAMS, cache_salt=b"other" if kind == "salted" else b"")
            sched.add(seq)
            live.append(seq)
        elif kind == "step":
            out = sched.schedule()
            for item in out.scheduled:
                s = item.seq
                first = s.num_computed_tokens // block_size
                last = (s.num_computed_tokens + item.num_new_tokens - 1) // block_size
                for i in range(first, last + 1):
                    assert bm.ref_counts[s.block_table[i]] == 1, "a write into a shared block"
            salts = {}
            for s in live:
                for blk in s.block_table:
                    assert salts.setdefault(blk, s.cache_salt) == s.cache_salt, "tenants share a block"
            sched.after_step(out)
            for item in out.scheduled:
                s = item.seq
                if s.status is SequenceStatus.RUNNING and s.num_computed_tokens == s.num_tokens:
                    s.append_token((a + s.seq_id) % 50)
                    if s.num_tokens >= num_blocks * block_size:
                        sched.finish(s, "length")
                        live.remove(s)
        elif kind == "finish" and live:
            seq = live[a % len(live)]
            sched.finish(seq, "abort")
            live.remove(seq)
        check_invariants(bm, live)
    for seq in list(live):
        sched.finish(seq, "abort")
    check_invariants(bm, [])
    assert bm.num_free_blocks == num_blocks


def test_prefix_blocks_survive_free_until_evicted():
    bm = BlockManager(4, 2)
    a = Sequence("a", [1, 2, 3, 4, 5], PARAMS)
    bm.allocate(a, 5)
    a.num_computed_tokens = 5
    bm.register_computed(a)
    first_two = a.block_table[:2]
    bm.free_seq(a)
    b = Sequence("b", [1, 2, 3, 4, 9], PARAMS)
    assert bm.find_cached_prefix(b) == first_two  # revived from the free list
    c = Sequence("c", [1, 2, 3, 4], PARAMS)
    assert bm.find_cached_prefix(c) == first_two[:1]  # never the whole prompt
    for _ in range(4):
        bm._take_free()  # hand out every block: the cache is evicted
    assert bm.find_cached_prefix(b) == [] and not bm.cached


def test_a_hit_needs_the_same_salt_and_the_same_tokens():
    bm = BlockManager(8, 2)
    a = Sequence("a", [1, 2, 3, 4, 5], PARAMS, cache_salt=b"tenant-a")
    bm.allocate(a, 5)
    a.num_computed_tokens = 5
    bm.register_computed(a)
    assert bm.find_cached_prefix(Sequence("a2", [1, 2, 3, 4, 9], PARAMS, cache_salt=b"tenant-a")) == a.block_table[:2]
    assert bm.find_cached_prefix(Sequence("b", [1, 2, 3, 4, 9], PARAMS, cache_salt=b"tenant-b")) == []
    assert bm.find_cached_prefix(Sequence("c", [1, 2, 3, 4, 9], PARAMS)) == []
    # A digest that maps to a block holding other tokens (a forged or colliding entry) is no hit.
    victim = Sequence("v", [7, 7, 7], PARAMS)
    bm._update_hashes(victim)
    bm.cached[victim.block_hashes[0]] = a.block_table[0]
    assert bm.find_cached_prefix(victim) == []


def _cached_then_new(bm: BlockManager, prompt: list[int]) -> tuple[set[int], set[int]]:
    """Cache a prompt's blocks, free them, then allocate for other tokens: (old, new) block ids."""
    a = Sequence("a", prompt, PARAMS)
    bm.allocate(a, len(prompt))
    a.num_computed_tokens = len(prompt)
    bm.register_computed(a)
    old = set(a.block_table)
    bm.free_seq(a)
    b = Sequence("b", [9] * len(prompt), PARAMS)
    bm.allocate(b, len(prompt))
    return old, set(b.block_table)


def test_lazy_pools_reuse_uncached_blocks_and_bound_the_cache():
    # A freed block with no cached prefix is reused before an untouched one is written.
    bm = BlockManager(8, 2, prefer_touched=True, cache_budget_blocks=4)
    a = Sequence("a", [1], PARAMS)
    bm.allocate(a, 1)
    first = a.block_table[0]
    bm.free_seq(a)
    b = Sequence("b", [2], PARAMS)
    bm.allocate(b, 1)
    assert b.block_table == [first]
    # Cached prefixes within the budget survive: new blocks are touched instead...
    old, new = _cached_then_new(BlockManager(8, 2, prefer_touched=True, cache_budget_blocks=4), [1, 2, 3, 4])
    assert not old & new
    # ...and over the budget the oldest cached blocks are evicted rather than new ones touched.
    old, new = _cached_then_new(BlockManager(8, 2, prefer_touched=True, cache_budget_blocks=2), [1, 2, 3, 4])
    assert len(new & old) == 1  # two cached blocks, one may stay
    old, new = _cached_then_new(BlockManager(8, 2, prefer_touched=True, cache_budget_blocks=1), [1, 2, 3, 4])
    assert new == old
    # A pool committed up front keeps every cached block while untouched ones remain.
    old, new = _cached_then_new(BlockManager(8, 2), [1, 2, 3, 4])
    assert not old & new
