"""Releasing KV blocks behind a sliding window (every layer slides): the scheduler and block manager
return blocks no future query can read, keep them revivable in the prefix cache, and never take a
block from a sequence that still shares it. No model: tokens are invented."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from lantern.app.engine.block_manager import BlockManager
from lantern.app.engine.sampling_params import SamplingParams
from lantern.app.engine.scheduler import Scheduler, SchedulerConfig
from lantern.app.engine.sequence import Sequence, SequenceStatus

PARAMS = SamplingParams(temperature=0, max_tokens=1000)


def make(num_blocks: int, block_size: int, window: int | None, chunk: int = 8, **bm_kwargs):
    bm = BlockManager(num_blocks, block_size, release_window=window, **bm_kwargs)
    sched = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=32, prefill_chunk_size=chunk), bm)
    return bm, sched


def step(sched: Scheduler, token: int = 7):
    """One engine step without a model: every sequence that finished its prompt draws `token`."""
    out = sched.schedule()
    sched.after_step(out)
    for item in out.scheduled:
        s = item.seq
        if s.status is SequenceStatus.RUNNING and s.num_computed_tokens == s.num_tokens:
            s.append_token(token + s.num_tokens % 11)
    return out


def check_window(bm: BlockManager, seq: Sequence) -> None:
    """Exactly the blocks before the next query's window are released; the rest are held."""
    first = bm.first_needed_block(seq.num_computed_tokens)
    assert all(b == -1 for b in seq.block_table[:first])
    assert all(b >= 0 for b in seq.block_table[first:])
    assert seq.num_released_blocks == min(first, len(seq.block_table))


def check_refcounts(bm: BlockManager, live: list[Sequence]) -> None:
    held = Counter(b for s in live for b in s.block_table if b >= 0)
    for block in range(bm.num_blocks):
        assert bm.ref_counts[block] == held.get(block, 0), f"block {block}"
        assert (block in bm.free or block in bm.fresh) == (bm.ref_counts[block] == 0)


def test_long_generation_holds_a_bounded_number_of_blocks():
    bm, sched = make(64, 4, window=8)
    seq = Sequence("a", list(range(30)), PARAMS)  # a prompt longer than the window, in chunks of 8
    sched.add(seq)
    peak = 0
    while seq.num_tokens < 230:
        step(sched)
        check_window(bm, seq)
        check_refcounts(bm, [seq])
        peak = max(peak, bm.num_used_blocks)
    # Window 8 = 2 blocks, plus the partly filled block and one chunk's worth during the prefill.
    assert peak <= 8 // 4 + 2 + 8 // 4
    assert bm.num_used_blocks <= 8 // 4 + 2
    assert len(seq.block_table) == bm.blocks_for(seq.num_computed_tokens + 1)  # the table keeps its length
    assert seq.block_table.count(-1) > 50
    # Without release the same run would need every block: 230 / 4 > 57 of the 64.
    sched.finish(seq, "length")
    assert bm.num_free_blocks == bm.num_blocks and all(r == 0 for r in bm.ref_counts)


def test_no_release_without_a_window():
    bm, sched = make(80, 4, window=None)
    seq = Sequence("a", list(range(30)), PARAMS)
    sched.add(seq)
    while seq.num_tokens < 100:
        step(sched)
    assert -1 not in seq.block_table and bm.num_used_blocks == len(seq.block_table)


def test_release_boundary_is_exact():
    # Window 8, block size 4: after n computed tokens the next query (at n) sees n-7..n, so block b
    # goes once (b + 1) * 4 <= n - 7.
    bm = BlockManager(16, 4, release_window=8)
    seq = Sequence("a", list(range(40)), PARAMS)
    bm.allocate(seq, 40)
    for n, expect in [(7, 0), (10, 0), (11, 1), (14, 1), (15, 2), (39, 8), (40, 8)]:
        seq.num_computed_tokens = n
        bm.release_behind_window(seq)
        assert seq.num_released_blocks == expect, n
        assert seq.block_table[:expect] == [-1] * expect and -1 not in seq.block_table[expect:]
    assert bm.num_used_blocks == 10 - 8


def test_preemption_after_release_frees_everything_and_recomputes():
    # Admission checks only a first chunk of 4 tokens, so four sequences start on 8 blocks; each
    # then needs up to 3 (window 8 + the block being written): some are preempted while holding
    # released (-1) entries, then recomputed from scratch.
    bm, sched = make(8, 4, window=8, chunk=4)
    seqs = [Sequence(f"s{i}", list(range(10 * i, 10 * i + 5)), PARAMS) for i in range(4)]
    for s in seqs:
        sched.add(s)
    preempted_with_released = 0
    for _ in range(1000):
        released_before = {s.seq_id: s.num_released_blocks for s in sched.running}
        out = sched.schedule()
        for victim in out.preempted:
            assert victim.block_table == [] and victim.num_released_blocks == 0
            assert victim.num_computed_tokens == 0 and victim.status is SequenceStatus.WAITING
            preempted_with_released += released_before.get(victim.seq_id, 0) > 0
        sched.after_step(out)
        for item in out.scheduled:
            s = item.seq
            if s.status is SequenceStatus.RUNNING and s.num_computed_tokens == s.num_tokens:
                s.append_token(3)
        for s in seqs:
            if s.status is SequenceStatus.RUNNING:
                check_window(bm, s)
                if s.num_tokens >= 60:
                    sched.finish(s, "length")
        check_refcounts(bm, [s for s in seqs if not s.is_finished])
        if all(s.is_finished for s in seqs):
            break
    assert all(s.is_finished for s in seqs)
    assert sched.num_preemptions > 0 and preempted_with_released > 0
    assert bm.num_free_blocks == bm.num_blocks


def test_released_blocks_stay_revivable_in_the_prefix_cache():
    bm, sched = make(64, 4, window=8)
    prompt = list(range(40))
    a = Sequence("a", prompt, PARAMS)
    sched.add(a)
    while a.num_tokens < 44:
        step(sched)
    held = {b for b in a.block_table if b >= 0}
    assert a.num_released_blocks >= 8
    # Released, published blocks sit in the free list with their digests (revivable, evictable).
    released_cached = [blk for blk, h in enumerate(bm.block_hash) if h is not None and bm.ref_counts[blk] == 0]
    assert len(released_cached) >= 8
    assert all(blk in bm.free for blk in released_cached)
    # A later request with the same 40-token prompt plus more: the hit reaches block 9 (tokens
    # 36..39 are published), and only the blocks the window at that point reads are revived.
    b = Sequence("b", prompt + [99, 98], PARAMS)
    hit = bm.find_cached_prefix(b)
    assert len(hit) == 10
    lo = bm.first_needed_block(40)
    assert hit[:lo] == [-1] * lo and all(x >= 0 for x in hit[lo:])
    revived = [x for x in hit if x >= 0 and bm.ref_counts[x] == 0]
    assert revived and set(revived) <= set(released_cached)  # a released block, brought back
    assert bm.blocks_needed(b, 42, hit) == len(revived) + 1
    free_before = bm.num_free_blocks
    sched.add(b)
    step(sched)
    assert b.num_cached_tokens == 40
    assert b.block_table[:lo] == [-1] * lo and b.num_released_blocks >= lo
    assert free_before - bm.num_free_blocks <= len(revived) + 1
    check_refcounts(bm, [a, b])
    assert not held - {x for x in a.block_table if x >= 0}  # a lost none of its own blocks


def test_a_hit_survives_eviction_of_blocks_before_the_window_but_not_inside_it():
    bm = BlockManager(32, 4, release_window=8)
    prompt = list(range(41))
    a = Sequence("a", prompt, PARAMS)
    bm.allocate(a, 41)
    a.num_computed_tokens = 41
    bm.register_computed(a)
    table = list(a.block_table)
    bm.free_seq(a)
    probe = Sequence("p", prompt, PARAMS)
    assert bm.find_cached_prefix(probe) == [-1] * 8 + table[8:10]  # 40 tokens; reads 33..40
    # Evict the head of the prefix: the hit does not need it.
    for blk in table[:8]:
        bm.cached.pop(bm.block_hash[blk])
        bm.block_hash[blk] = None
    assert bm.find_cached_prefix(Sequence("p2", prompt, PARAMS)) == [-1] * 8 + table[8:10]
    # Evict a block the window reads at the end: the hit falls back to the longest valid one.
    bm.cached.pop(bm.block_hash[table[8]])
    bm.block_hash[table[8]] = None
    assert bm.find_cached_prefix(Sequence("p3", prompt, PARAMS)) == []  # block 9 alone: its window needs 8
    # Without a window the same evictions end the hit at the first missing block.
    plain = BlockManager(32, 4)
    c = Sequence("c", prompt, PARAMS)
    plain.allocate(c, 41)
    c.num_computed_tokens = 41
    plain.register_computed(c)
    first = c.block_table[0]
    plain.free_seq(c)
    plain.cached.pop(plain.block_hash[first])
    plain.block_hash[first] = None
    assert plain.find_cached_prefix(Sequence("p4", prompt, PARAMS)) == []


def test_release_of_a_shared_block_only_drops_a_reference():
    bm, sched = make(64, 4, window=8)
    prompt = list(range(41))
    a = Sequence("a", prompt, PARAMS)
    sched.add(a)
    step(sched)  # computes the first 8 tokens (chunk 8): blocks 0 and 1, published
    shared = a.block_table[:2]
    b = Sequence("b", prompt[:9], PARAMS)  # its hit: blocks 0 and 1 of a, shared
    assert bm.find_cached_prefix(b) == shared
    sched.add(b)
    while a.num_released_blocks < 3:
        step(sched)
        check_refcounts(bm, [a, b])
    # a released blocks 0 and 1 but b still reads them (its window at 9..): held, not free.
    assert a.block_table[:2] == [-1, -1] and b.block_table[:2] == shared and b.num_computed_tokens == 10
    assert all(bm.ref_counts[x] == 1 and x not in bm.free for x in shared)
    while b.num_tokens < 30:
        step(sched)
        check_refcounts(bm, [a, b])
    assert b.block_table[:2] == [-1, -1] and all(bm.ref_counts[x] == 0 for x in shared)
    sched.finish(a, "length")
    sched.finish(b, "length")
    assert bm.num_free_blocks == bm.num_blocks


ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 3), st.integers(1, 40)),  # prefix id, suffix length
        st.tuples(st.just("step"), st.integers(0, 2**16)),
        st.tuples(st.just("finish"), st.integers(0, 50)),
    ),
    min_size=1,
    max_size=80,
)


@settings(max_examples=120, deadline=None)
@given(
    ops=ops,
    num_blocks=st.integers(6, 40),
    block_size=st.sampled_from([1, 2, 4]),
    window=st.integers(1, 12),
    chunk=st.integers(1, 16),
    caching=st.booleans(),
    touched=st.booleans(),
)
def test_accounting_with_release(ops, num_blocks, block_size, window, chunk, caching, touched):
    bm = BlockManager(
        num_blocks, block_size, enable_prefix_caching=caching, prefer_touched=touched, release_window=window
    )
    sched = Scheduler(SchedulerConfig(max_num_seqs=6, max_num_batched_tokens=24, prefill_chunk_size=chunk), bm)
    prefixes = [[100 + p] * 12 for p in range(4)]
    live: list[Sequence] = []
    for op in ops:
        if op[0] == "add":
            seq = Sequence("r", (prefixes[op[1]] + list(range(op[2])))[: max(1, num_blocks * block_size // 2)], PARAMS)
            sched.add(seq)
            live.append(seq)
        elif op[0] == "step":
            out = sched.schedule()
            for item in out.scheduled:
                s = item.seq
                # Every block this step's queries read or write is present; writes are unshared.
                lo = bm.first_needed_block(s.num_computed_tokens)
                end = s.num_computed_tokens + item.num_new_tokens
                assert all(b >= 0 for b in s.block_table[lo : bm.blocks_for(end)])
                for i in range(s.num_computed_tokens // block_size, (end - 1) // block_size + 1):
                    assert bm.ref_counts[s.block_table[i]] == 1, "a write into a shared block"
            sched.after_step(out)
            for item in out.scheduled:
                s = item.seq
                if s.status is SequenceStatus.RUNNING:
                    check_window(bm, s)
                    if s.num_computed_tokens == s.num_tokens:
                        s.append_token((op[1] + s.seq_id) % 50)
                        if s.num_tokens >= 3 * num_blocks * block_size:
                            sched.finish(s, "length")
                            live.remove(s)
        elif live:
            seq = live[op[1] % len(live)]
            sched.finish(seq, "abort")
            live.remove(seq)
        check_refcounts(bm, live)
        for s in live:
            if s.status is not SequenceStatus.RUNNING:
                assert not s.block_table and s.num_released_blocks == 0
    for seq in list(live):
        sched.finish(seq, "abort")
    check_refcounts(bm, [])
    assert bm.num_free_blocks == num_blocks
