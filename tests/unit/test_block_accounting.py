"""Property-based block accounting: scheduler + block manager under random add/abort/finish/fork.

No model: tokens are invented. After every operation each block's ref count must equal the number of
live block tables holding it, free blocks must be exactly those with no references, and at the end
every block must be free.
"""
from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.block_manager import BlockManager
from app.engine.sampling_params import SamplingParams
from app.engine.scheduler import Scheduler, SchedulerConfig
from app.engine.sequence import Sequence, SequenceStatus

PARAMS = SamplingParams(temperature=0, max_tokens=64)

ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 3), st.integers(1, 40)),  # prefix id, suffix length
        st.tuples(st.just("step"), st.integers(0, 2**16), st.integers(0, 0)),
        st.tuples(st.just("finish"), st.integers(0, 50), st.integers(0, 0)),
        st.tuples(st.just("fork"), st.integers(0, 50), st.integers(0, 0)),
    ),
    min_size=1,
    max_size=80,
)


def check_invariants(bm: BlockManager, live: list[Sequence]) -> None:
    held = Counter(b for s in live for b in s.block_table)
    for block in range(bm.num_blocks):
        assert bm.ref_counts[block] >= 0
        assert bm.ref_counts[block] == held.get(block, 0), f"block {block}"
        assert (block in bm.free) == (bm.ref_counts[block] == 0)
    for h, block in bm.cached.items():
        assert bm.block_hash[block] == h
    for s in live:
        if s.status is not SequenceStatus.RUNNING:
            assert not s.block_table  # waiting sequences (new or preempted) hold nothing


@settings(max_examples=150, deadline=None)
@given(ops=ops, num_blocks=st.integers(8, 40), block_size=st.sampled_from([1, 2, 4]),
       chunk=st.integers(1, 16), caching=st.booleans())
def test_no_block_leaked_or_double_freed(ops, num_blocks, block_size, chunk, caching):
    bm = BlockManager(num_blocks, block_size, enable_prefix_caching=caching)
    sched = Scheduler(
        SchedulerConfig(max_num_seqs=6, max_num_batched_tokens=24, prefill_chunk_size=chunk),
        bm,
    )
    prefixes = [[100 + p] * 12 for p in range(4)]
    live: list[Sequence] = []
    for kind, a, b in ops:
        if kind == "add":
            prompt = (prefixes[a] + list(range(b)))[: max(1, num_blocks * block_size // 2)]
            seq = Sequence("r", prompt, PARAMS)
            sched.add(seq)
            live.append(seq)
        elif kind == "step":
            out = sched.schedule()
            sched.after_step(out)
            for item in out.scheduled:
                s = item.seq
                if s.status is SequenceStatus.RUNNING and s.num_computed_tokens == s.num_tokens:
                    s.output_token_ids.append((a + s.seq_id) % 50)
                    if s.num_tokens >= num_blocks * block_size:
                        sched.finish(s, "length")
                        live.remove(s)
        elif kind == "finish" and live:
            seq = live[a % len(live)]
            sched.finish(seq, "abort")
            live.remove(seq)
        elif kind == "fork" and live:
            parent = live[a % len(live)]
            # As the engine forks n>1 siblings: after the prompt is computed, share every block.
            if parent.status is SequenceStatus.RUNNING and parent.num_computed_tokens == parent.num_tokens:
                child = Sequence("r", parent.token_ids, PARAMS)
                bm.fork(parent, child)
                child.num_computed_tokens = parent.num_tokens - 1
                sched.add_running(child)
                live.append(child)
        check_invariants(bm, live)
    for seq in list(live):
        sched.finish(seq, "abort")
    check_invariants(bm, [])
    assert bm.num_free_blocks == num_blocks


def test_copy_on_write_gives_private_block():
    bm = BlockManager(8, 4)
    parent = Sequence("p", list(range(6)), PARAMS)
    bm.allocate(parent, 6)
    child = Sequence("c", list(range(6)), PARAMS)
    bm.fork(parent, child)
    assert child.block_table == parent.block_table and bm.ref_counts[parent.block_table[1]] == 2
    pairs = bm.copy_on_write(child, 5, 6)  # position 5 lives in the shared second block
    assert pairs == [(parent.block_table[1], child.block_table[1])]
    assert child.block_table[0] == parent.block_table[0]
    assert bm.ref_counts[parent.block_table[1]] == 1 and bm.ref_counts[child.block_table[1]] == 1


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
