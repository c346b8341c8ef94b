"""The prefix cache's recurrent-state snapshots (app/engine/state_cache.py) as the scheduler uses them: where
prefills are cut, which copies a step asks of the backend, and least-recently-used eviction. No model: the
conformance suite (tests/conformance/test_recurrent_prefix_cache.py) checks what the restored states compute."""

from __future__ import annotations

from lantern.app.engine import SamplingParams
from lantern.app.engine.block_manager import BlockManager
from lantern.app.engine.scheduler import Scheduler, SchedulerConfig
from lantern.app.engine.sequence import Sequence
from lantern.app.engine.state_cache import Snapshot, StateCache, checkpoints

PARAMS = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


def test_snapshot_slots_are_handed_out_lowest_first_and_evicted_least_recently_used_first():
    cache = StateCache(first=3, count=2)
    assert cache.store(b"a") == 3 and cache.store(b"b") == 4
    assert cache.store(b"a") is None  # taken already: nothing to copy, but now the most recently used
    assert cache.store(b"c") == 4  # evicts b
    assert cache.longest([b"x", b"b"]) == (0, None)
    assert cache.longest([b"a", b"x", b"c"]) == (3, 4)  # the longest prefix with a snapshot
    assert cache.longest([b"a"]) == (1, 3)  # a is now the most recent ...
    assert cache.store(b"d") == 4  # ... so c goes
    assert not cache.holds(Snapshot(b"c", 4, 8)) and cache.holds(Snapshot(b"a", 3, 8))
    assert cache.saves == 4


def test_checkpoints_are_the_shared_blocks_end_and_the_last_boundary_short_of_the_prompt_end():
    assert checkpoints(30, 0, 0, 4) == [28]
    assert checkpoints(28, 0, 0, 4) == [24]  # a prompt of whole blocks: its last token is always computed
    assert checkpoints(30, 0, 20, 4) == [20, 28]
    assert checkpoints(30, 20, 20, 4) == [28]  # restored there already
    assert checkpoints(30, 28, 28, 4) == []
    assert checkpoints(4, 0, 0, 4) == []  # no boundary before the last token


def _engine_parts(snapshots: int = 2, chunk: int = 64, seqs: int = 2) -> Scheduler:
    bm = BlockManager(64, 4)
    config = SchedulerConfig(max_num_seqs=seqs, prefill_chunk_size=chunk, state_slots=seqs, state_snapshots=snapshots)
    return Scheduler(config, bm)


def _run(sched: Scheduler, seq: Sequence) -> list[tuple[list[int], list[tuple[int, int]], list[tuple[int, int]]]]:
    """Schedule seq to the end of its prompt plus one decode: per step (chunk sizes, restores, saves)."""
    sched.add(seq)
    steps = []
    while seq.num_computed_tokens < seq.num_tokens:
        out = sched.schedule()
        saves = sched.after_step(out)
        steps.append(([s.num_new_tokens for s in out.scheduled], out.state_restores, saves))
        if seq.num_computed_tokens == seq.num_tokens:
            seq.append_token(7)  # the token the step drew
            if len(seq.output_token_ids) == 2:
                break
    sched.finish(seq, "length")
    return steps


def test_a_prefill_is_cut_at_its_snapshot_point_and_a_follow_up_starts_there():
    sched = _engine_parts()
    prompt = list(range(10, 20))  # 10 tokens: the snapshot lands at 8
    steps = _run(sched, Sequence("a", prompt, PARAMS))
    assert steps[0] == ([8], [], [(0, 2)])  # running slot 0 copied into snapshot slot 2 (after slots 0-1)
    assert [s[0] for s in steps[1:]] == [[2], [1]]
    follow = Sequence("b", prompt + [7, 30, 31, 32, 33], PARAMS)
    steps = _run(sched, follow)
    assert follow.num_cached_tokens == 8
    assert steps[0][1] == [(2, 0)]  # the snapshot restored into the slot it runs in
    assert steps[0][0] == [4] and steps[0][2] == [(0, 3)]  # cut again at its own last boundary, 12
    assert sched.states is not None and sched.states.restores == 1


def test_a_prompt_that_parts_from_cached_blocks_leaves_a_snapshot_where_it_parts():
    sched = _engine_parts(chunk=5)
    system = list(range(100, 109))  # 9 tokens: 2 whole blocks shared
    _run(sched, Sequence("a", system + [1, 2, 3, 4, 5, 6, 7], PARAMS))  # its snapshot: at 12
    second = Sequence("b", system + [4, 5, 6], PARAMS)
    steps = _run(sched, second)
    assert second.num_cached_tokens == 0  # cached blocks, but no state at their end
    assert [s[0] for s in steps[:3]] == [[5], [3], [4]]  # chunks of 5, cut at 8 (the shared blocks' end)
    assert steps[1][2] == [(0, 3)]
    third = Sequence("c", system + [9, 9, 9, 9], PARAMS)
    _run(sched, third)
    assert third.num_cached_tokens == 8


def test_another_salt_never_sees_a_snapshot():
    sched = _engine_parts()
    prompt = list(range(10, 20))
    _run(sched, Sequence("a", prompt, PARAMS))
    other = Sequence("b", prompt, PARAMS, cache_salt=b"tenant-2")
    steps = _run(sched, other)
    assert other.num_cached_tokens == 0 and steps[0][1] == []


def test_more_snapshots_in_one_step_than_slots_copy_once_into_each_slot_from_its_owner():
    """Three prompts reach their snapshot point in one step with two slots: the first one's is evicted
    by the third's within the step; each slot is copied into once, from the sequence its digest names."""
    sched = _engine_parts(snapshots=2, seqs=3)
    seqs = [Sequence(f"r{i}", list(range(10 * i + 10, 10 * i + 20)), PARAMS) for i in range(3)]
    for seq in seqs:
        sched.add(seq)
    saves = sched.after_step(sched.schedule())
    assert sorted(dst for _, dst in saves) == [3, 4]
    assert sched.states is not None
    owner = {slot: digest for digest, slot in sched.states.slots.items()}
    by_slot = {s.state_slot: s for s in seqs}
    for src, dst in saves:
        assert owner[dst] == by_slot[src].block_hashes[1]  # the digest of its blocks [0, 8)
    assert {by_slot[src].request_id for src, _ in saves} == {"r1", "r2"}


def test_a_snapshot_moves_to_a_new_digest_in_its_slot():
    cache = StateCache(first=2, count=2)
    own = Snapshot(b"a", cache.store(b"a"), 8)
    cache.store(b"b")
    moved = cache.move(own, b"c", 12)
    assert moved == Snapshot(b"c", 2, 12) and not cache.holds(own) and cache.holds(moved)
    assert cache.longest([b"c"]) == (1, 2) and cache.longest([b"a"]) == (0, None)
    assert cache.move(moved, b"b", 16) is None and cache.holds(moved)  # b has a snapshot of its own already
    assert cache.store(b"d") == 3  # b was least recently used (c moved after it)
    assert cache.move(Snapshot(b"b", 3, 4), b"e", 8) is None  # evicted: nothing to move


def _decode(sched: Scheduler, seqs: list[Sequence], tokens: int) -> list[list[tuple[int, int]]]:
    """Admit seqs and run them `tokens` tokens past their prompts: the saves of each step."""
    for seq in seqs:
        sched.add(seq)
    saves = []
    while any(len(s.output_token_ids) < tokens for s in seqs):
        out = sched.schedule()
        drew = [item.seq for item in out.scheduled if item.samples]
        saves.append(sched.after_step(out))
        for seq in drew:
            seq.append_token(50 + len(seq.output_token_ids))
    return saves


def test_a_decoding_sequence_moves_its_own_snapshot_a_block_at_a_time():
    sched = _engine_parts(snapshots=4)
    seq = Sequence("a", list(range(10, 20)), PARAMS)  # 10 tokens: a prefill snapshot at 8
    saves = _decode(sched, [seq], 8)  # computes up to 17: boundaries 12 and 16 while decoding
    assert saves[0] == [(0, 2)]  # the prompt's snapshot
    taken = [s for step in saves[1:] for s in step]
    assert taken == [(0, 3), (0, 3)]  # its decode snapshot: one slot, moved from 12 to 16
    assert seq.decode_snapshot == Snapshot(sched.bm.digest(seq, 3), 3, 16)
    states = sched.states
    assert states is not None and states.longest(seq.block_hashes[:4]) == (4, 3)
    assert states.longest(seq.block_hashes[:3]) == (2, 2)  # 12 moved on; the prompt's at 8 stays
    sched.finish(seq, "length")
    assert seq.decode_snapshot is None and states.holds(Snapshot(seq.block_hashes[3], 3, 16))  # stays cached


def test_running_sequences_hold_at_most_half_the_snapshot_slots_for_decoding():
    sched = _engine_parts(snapshots=2, seqs=2)
    a, b = Sequence("a", list(range(10, 20)), PARAMS), Sequence("b", list(range(30, 40)), PARAMS)
    _decode(sched, [a, b], 4)  # both reach 12 while decoding: one slot for the two
    assert [s.decode_snapshot is not None for s in (a, b)] == [True, False]
    one = _engine_parts(snapshots=1, seqs=1)
    c = Sequence("c", list(range(10, 20)), PARAMS)
    _decode(one, [c], 4)
    assert c.decode_snapshot is None  # a single slot stays the prompts'


def test_a_preempted_sequence_restarts_from_its_own_decode_snapshot():
    sched = _engine_parts(snapshots=4)
    seq = Sequence("a", list(range(10, 20)), PARAMS)
    _decode(sched, [seq], 8)  # its decode snapshot at 16, in slot 3
    sched._preempt(seq)
    assert seq.decode_snapshot is None and seq.num_computed_tokens == 0
    out = sched.schedule()
    assert out.state_restores == [(3, seq.state_slot)] and seq.num_computed_tokens == 16
