"""Continuous batching: which sequences run this step and how many tokens each computes.

One token budget per step is shared by decodes (1 token each) and prefill chunks (up to
``prefill_chunk_size`` each). Running sequences are served oldest first so none starves; when the
KV pool runs dry the newest running sequence is preempted (its blocks freed, to be recomputed
later) and put back at the head of the waiting queue (a model with recurrent layers also
gives back its recurrent-state slot, and recomputes the state from position 0, or from a snapshot
of it: app/engine/state_cache.py). When every layer
of the model slides, the blocks a sequence's future queries can no longer see are returned to the
pool after each step (BlockManager.release_behind_window), so a long generation holds about
window / block_size blocks.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field

from lantern.app.engine.block_manager import BlockManager
from lantern.app.engine.sequence import Sequence, SequenceStatus
from lantern.app.engine.state_cache import Snapshot, StateCache, checkpoints

logger = logging.getLogger(__name__)

# Prompt positions per step whose log-probabilities are computed (SamplingParams.prompt_logprobs): each needs a
# whole vocabulary of float32 logits and their log-softmax at once (~2 MB per position at a 256K vocabulary).
SCORED_ROWS_PER_STEP = 256


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    prefill_chunk_size: int = 512
    # A bidirectional encoder (BERT) attends over its whole input at once: each prompt runs in one
    # piece (admitted only when all of it fits this step's budget; the engine sizes both to fit).
    whole_prompts: bool = False
    # Recurrent-state slots (models with recurrent layers: the backend holds max_num_seqs of
    # them): a running sequence holds one from admission until it finishes or is preempted. 0: none.
    state_slots: int = 0
    # Snapshot slots of that state for prefix caching, numbered after the running sequences' (StateCache); 0: none.
    state_snapshots: int = 0


@dataclass
class ScheduledSeq:
    seq: Sequence
    num_new_tokens: int

    @property
    def samples(self) -> bool:
        """True when this step computes the sequence's last known token, so a new one is drawn."""
        return self.seq.num_computed_tokens + self.num_new_tokens == self.seq.num_tokens


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    # (snapshot slot, sequence's slot): recurrent states to copy before this step's forward pass.
    state_restores: list[tuple[int, int]] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager):
        self.config = config
        self.bm = block_manager
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order: oldest first
        self.num_preemptions = 0
        # Blocks kept free when admitting new work, so running sequences can grow a little
        # before anyone has to be preempted.
        self.admission_reserve = max(1, block_manager.num_blocks // 100)
        self.free_state_slots = list(range(config.state_slots - 1, -1, -1))  # popped lowest first
        self.states = StateCache(config.state_slots, config.state_snapshots) if config.state_snapshots else None

    # ---- queue management ----------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def add_front(self, seqs: list[Sequence]) -> None:
        """Sequences of an already admitted request (n > 1 samples) wait ahead of new requests."""
        for seq in reversed(seqs):
            seq.status = SequenceStatus.WAITING
            self.waiting.appendleft(seq)

    def finish(self, seq: Sequence, reason: str) -> None:
        """Remove seq wherever it is and return its blocks to the pool at once."""
        if seq.status is SequenceStatus.FINISHED:
            return
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        else:
            try:
                self.waiting.remove(seq)
            except ValueError:
                pass
        self.bm.free_seq(seq)
        self._release_state(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- the step ------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        scored = SCORED_ROWS_PER_STEP  # prompt positions whose log-probabilities this step may compute
        queue = list(self.running)
        kept: list[Sequence] = []
        while queue:
            seq = queue.pop(0)
            n = self._scored_cap(seq, self.chunk_tokens(seq, budget), scored)
            if n == 0:
                kept.append(seq)
                continue
            end = seq.num_computed_tokens + n
            # Grow the block table; preempt the newest others (then seq itself) until it fits.
            while not self.bm.can_allocate(self._blocks_to_write(seq, end)):
                victim = queue.pop() if queue else seq
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is seq:
                    break
            if seq.status is not SequenceStatus.RUNNING:
                continue
            self.bm.allocate(seq, end)
            out.scheduled.append(ScheduledSeq(seq, n))
            kept.append(seq)
            budget -= n
            scored -= n if seq.scores_prompt else 0
        self.running = kept

        # Admit waiting sequences only while nothing had to be preempted this step.
        while not out.preempted and self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            if self.config.state_slots and not self.free_state_slots:
                break
            seq = self.waiting[0]
            reads = seq.cacheable and not seq.scores_prompt  # (a scored prompt is computed whole: its logits)
            cached = self.bm.find_cached_prefix(seq) if seq.num_computed_tokens == 0 and reads else []
            snapshot: int | None = None
            cuts: list[int] = []
            if self.states is not None and reads:
                cached, snapshot, cuts = self._recurrent_prefix(seq, cached)
            computed = len(cached) * self.bm.block_size
            n = self._scored_cap(seq, min(seq.num_tokens - computed, self.config.prefill_chunk_size, budget), scored)
            if n == 0:
                break
            if cuts:  # the first chunk ends at the first snapshot point
                n = min(n, cuts[0] - computed)
            if self.config.whole_prompts and n < seq.num_tokens - computed:
                break
            need = self.bm.blocks_needed(seq, computed + n, cached)
            if not self.bm.can_allocate(need, self.admission_reserve):
                if not self.running and not out.scheduled:
                    # Nothing else holds blocks: admit without the reserve rather than stall.
                    if not self.bm.can_allocate(need):
                        break
                else:
                    break
            self.waiting.popleft()
            scored -= n if seq.scores_prompt else 0
            if seq.num_preemptions == 0 and seq.cacheable:
                self.bm.record_lookup(seq.num_prompt_tokens, computed)
                seq.num_cached_tokens = computed
            self.bm.allocate(seq, computed + n, cached)
            if self.config.state_slots:
                # From position 0 the backend starts the state from zero; from a cached prefix, from its snapshot.
                seq.state_slot = self.free_state_slots.pop()
                seq.state_checkpoints, seq.state_restore = cuts, None
                if snapshot is not None and self.states is not None:
                    seq.state_restore = Snapshot(seq.block_hashes[len(cached) - 1], snapshot, computed)
                    out.state_restores.append((snapshot, seq.state_slot))
                    self.states.restores += 1
            seq.num_computed_tokens = computed
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append(ScheduledSeq(seq, n))
            budget -= n
        return out

    def schedule_ahead(self, seqs: list[Sequence]) -> SchedulerOutput | None:
        """One more decode token for each of `seqs`, running sequences whose step in flight draws their next token
        (app/engine/step_ahead.py): blocks for it allocated, num_computed_tokens left as it is (that step's processing
        advances it). None when a waiting sequence could be admitted (a sequence slot is free) or the blocks would
        need a preemption: the ordinary schedule() decides then. (With every slot taken it would admit none either.)"""
        if self.waiting and len(self.running) < self.config.max_num_seqs:
            return None
        ends = [seq.num_computed_tokens + 2 for seq in seqs]  # (the token in flight, then the one ahead)
        if not self.bm.can_allocate(sum(self._blocks_to_write(seq, end) for seq, end in zip(seqs, ends, strict=True))):
            return None
        out = SchedulerOutput()
        for seq, end in zip(seqs, ends, strict=True):
            self.bm.allocate(seq, end)
            out.scheduled.append(ScheduledSeq(seq, 1))
        return out

    def _recurrent_prefix(self, seq: Sequence, cached: list[int]) -> tuple[list[int], int | None, list[int]]:
        """The cached blocks a sequence with recurrent state can use (only up to the last cached block
        boundary with a state snapshot), that snapshot's slot, and where its prefill is cut for new ones."""
        assert self.states is not None
        bs = self.bm.block_size
        k, snapshot = self.states.longest(seq.block_hashes[: len(cached)])
        return cached[:k], snapshot, checkpoints(seq.num_prompt_tokens, k * bs, len(cached) * bs, bs)

    def chunk_tokens(self, seq: Sequence, budget: int) -> int:
        """Tokens a running sequence computes next within `budget`: a prefill chunk, cut at its next snapshot
        point, or one decode token."""
        remaining = seq.num_tokens - seq.num_computed_tokens
        if remaining > 1:
            remaining = min(remaining, self.config.prefill_chunk_size)
        if seq.state_checkpoints:  # a chunk ends where the recurrent state is to be snapshotted
            remaining = min(remaining, seq.state_checkpoints[0] - seq.num_computed_tokens)
        return max(min(remaining, budget), 0)

    def _scored_cap(self, seq: Sequence, n: int, scored: int) -> int:
        """n, cut to the step's scored-rows budget while seq computes a prompt whose logprobs it returns: each such
        row holds a whole vocabulary of float32 logits (and their log-softmax) at once."""
        if not seq.scores_prompt or self.config.whole_prompts or seq.num_computed_tokens >= seq.num_prompt_tokens - 1:
            return n
        return max(min(n, scored), 0)

    def _blocks_to_write(self, seq: Sequence, end: int) -> int:
        """New blocks needed to cover `end` tokens (writes never land in shared blocks)."""
        return max(self.bm.blocks_for(end) - len(seq.block_table), 0)

    def _preempt(self, seq: Sequence) -> None:
        """Recompute-style preemption: drop the KV, keep the tokens, requeue at the front."""
        if seq in self.running:
            self.running.remove(seq)
        self.bm.free_seq(seq)
        self._release_state(seq)
        seq.num_computed_tokens = 0
        seq.state_checkpoints = []  # set again at its next admission
        seq.num_preemptions += 1
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1
        logger.debug("preempted seq %d (request %s)", seq.seq_id, seq.request_id)

    def _release_state(self, seq: Sequence) -> None:
        if seq.state_slot is not None:
            self.free_state_slots.append(seq.state_slot)
            seq.state_slot = None
        seq.decode_snapshot = None  # (its last one stays cached, no longer moved)

    def after_step(self, out: SchedulerOutput) -> list[tuple[int, int]]:
        """Advance progress of the sequences that ran, publish newly full blocks, then release
        the blocks now behind every layer's window (published first, so they stay revivable).
        Returns the recurrent-state snapshots to take now, before the next forward pass:
        (sequence's slot, snapshot slot) for each sequence that just reached a checkpoint. When more
        reach one than there are snapshot slots, a slot stored earlier in the step is evicted again and
        only its last owner's copy is kept (one copy per destination: a scatter with a repeated
        destination leaves either source there)."""
        saves: dict[int, int] = {}  # snapshot slot -> sequence's slot
        boundary: list[Sequence] = []  # decoding sequences at a block boundary: their own snapshots move there
        for item in out.scheduled:
            seq = item.seq
            if seq.status is not SequenceStatus.RUNNING:
                continue
            seq.num_computed_tokens += item.num_new_tokens
            if seq.cacheable:
                self.bm.register_computed(seq)
            self.bm.release_behind_window(seq)
            while seq.state_checkpoints and seq.state_checkpoints[0] <= seq.num_computed_tokens:
                at = seq.state_checkpoints.pop(0)
                if at == seq.num_computed_tokens and self.states is not None and seq.state_slot is not None:
                    slot = self.states.store(self.bm.digest(seq, at // self.bm.block_size - 1))
                    if slot is not None:
                        saves[slot] = seq.state_slot
            if item.num_new_tokens == 1 and self.states is not None and self._at_decode_boundary(seq):
                boundary.append(seq)
        if boundary:
            self._decode_snapshots(boundary, saves)
        return [(src, dst) for dst, src in saves.items()]

    def _at_decode_boundary(self, seq: Sequence) -> bool:
        n = seq.num_computed_tokens
        return (
            not n % self.bm.block_size and n >= seq.num_prompt_tokens and seq.cacheable and seq.state_slot is not None
        )

    def _decode_snapshots(self, seqs: list[Sequence], saves: dict[int, int]) -> None:
        """Decoding sequences that just reached a block boundary past their prompts move their own snapshots
        there; one without a snapshot takes a slot while running sequences hold fewer than half of them (counted
        once a step, only when one asks). `saves` gets the copies."""
        assert self.states is not None
        held: int | None = None
        for seq in seqs:
            n, src = seq.num_computed_tokens, seq.state_slot
            assert src is not None  # (_at_decode_boundary)
            digest = self.bm.digest(seq, n // self.bm.block_size - 1)
            own = seq.decode_snapshot
            if own is not None and self.states.holds(own):
                moved = self.states.move(own, digest, n)
                if moved is not None:  # (None: another sequence holds this very state already; keep the old one)
                    seq.decode_snapshot = moved
                    saves[moved.slot] = src
                continue
            if held is None:
                held = sum(1 for s in self.running if s.decode_snapshot and self.states.holds(s.decode_snapshot))
            seq.decode_snapshot = None
            if held >= self.states.count // 2:
                continue
            slot = self.states.store(digest)
            if slot is not None:
                seq.decode_snapshot = Snapshot(digest, slot, n)
                saves[slot] = src
                held += 1
