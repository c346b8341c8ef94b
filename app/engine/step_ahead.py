"""Decode steps scheduled ahead (vLLM's --async-scheduling, SGLang's overlap scheduler, mlx-lm's async_eval).

Without it the device idles while the host works between two steps: it collects step N's tokens, detokenizes
them, checks stop conditions, streams them, schedules and builds step N+1, and only then launches it. At batch
size 1 on a GPU a step takes ~1-3 ms and that host work ~0.1-0.3 ms of Python: a tenth of the time. Here, once
step N is launched and before its tokens are read back, the engine schedules step N+1 -- every sequence of N
decoding one more token, whose id is N's sampled token, still on the device (ScheduledBatch.carried) -- and
launches it behind N; then it collects and processes N while the device runs N+1.

N+1 is scheduled ahead only where it is the step the scheduler would choose after N anyway (each draw keeps its
key, each stop its place), so that a generation is the same token for token with and without it -- wherever the
kernels' results do not hang on the batch's shape: a step ahead may still hold a row that N has just ended, and a
request arriving meanwhile joins a step later, so in bfloat16 on a GPU a near-tie may fall the other way:
  * no waiting request could be admitted (a sequence slot is free: the scheduler admits it at the next ordinary
    step) and N+1's blocks fit without preempting anyone;
  * every sequence of N decoded one token it had drawn before (a prefill chunk, a first token: not ahead);
  * no sequence needs N's token on the host to draw the next one -- a grammar or a thinking budget (their masks
    follow the text), penalties (their counts), min_tokens' bans -- nor keeps recurrent state, which a step
    computed ahead and then thrown away would have moved on.
A sequence that N ends by length is left out of N+1. One that N ends otherwise (EOS, a stop string, an abort) had
a token computed ahead in vain: processing N+1 skips it (its blocks were freed when it finished, and the device
runs N+1's writes before any later step's, so a block handed on meanwhile is written by its new owner last).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from lantern.app.engine.contract import PendingStep, SamplingRow, ScheduledBatch, StepOutput
from lantern.app.engine.scheduler import Scheduler, SchedulerOutput
from lantern.app.engine.sequence import Sequence

Launched = tuple[SchedulerOutput, ScheduledBatch, PendingStep]


class StepAhead:
    """Schedules and launches step N+1 behind a launched step N (the module's docstring says when).

    `continues(seq)`, for a sequence N decodes: True when it may decode its next token before N's is known on the
    host (the engine's per-request conditions: no grammar, budget or penalties, min_tokens reached); None when N
    ends it (its length): it is left out; False when it needs N's token first: then no step is launched ahead (a
    step without it would hold it back a step)."""

    def __init__(
        self, scheduler: Scheduler, backend: Any, block_size: int, continues: Callable[[Sequence], bool | None]
    ):
        self.scheduler = scheduler
        self.backend = backend
        self.block_size = block_size
        self.continues = continues
        self.launched = 0  # steps launched ahead (tests and stats read it)

    def launch_after(self, sched: SchedulerOutput, batch: ScheduledBatch, pending: PendingStep) -> Launched | None:
        """Step N+1 launched behind `pending` (step N, scheduled as `sched`, built as `batch`), or None."""
        if isinstance(pending, FailedLaunch) or len(batch.sample_seq_indices) != len(sched.scheduled):
            return None
        rows: list[tuple[Sequence, int]] = []
        for row, item in enumerate(sched.scheduled):  # (every item samples: rows in scheduled order)
            seq = item.seq
            if item.num_new_tokens != 1 or not seq.output_token_ids:
                return None
            go = None if seq.is_finished else self.continues(seq)  # (ended since N was launched: left out)
            if go is False:
                return None
            if go:
                rows.append((seq, row))
        if not rows:
            return None
        ahead = self.scheduler.schedule_ahead([seq for seq, _ in rows])
        if ahead is None:
            return None
        step = ahead_batch(rows, self.block_size)
        self.launched += 1
        try:
            return ahead, step, self.backend.launch(step, after=pending)
        except Exception as exc:  # (the engine's next step fails it as it would fail an ordinary step)
            return ahead, step, FailedLaunch(exc)


class FailedLaunch:
    """A step whose launch raised: its result() raises that, when the engine collects the step."""

    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    def result(self) -> StepOutput:
        raise self.exc


def ahead_batch(rows: list[tuple[Sequence, int]], block_size: int) -> ScheduledBatch:
    """The batch of step N+1 for (sequence, its sampling row in N): one token each at the position after N's, its id
    N's token at that row. Built before N's processing advances the sequences (num_computed_tokens is still N's
    position, the token not yet appended)."""
    n = len(rows)
    positions = np.empty(n, dtype=np.int32)
    slots = np.empty(n, dtype=np.int32)
    tables: list[list[int]] = []
    sampling: list[SamplingRow] = []
    for i, (seq, _) in enumerate(rows):
        pos = seq.num_computed_tokens + 1
        positions[i] = pos
        slots[i] = seq.block_table[pos // block_size] * block_size + pos % block_size
        tables.append(list(seq.block_table))  # (N's processing may release blocks behind a window from it)
        sampling.append(SamplingRow(params=seq.params, seed=seq.seed, step=len(seq.output_token_ids) + 1))
    return ScheduledBatch(
        input_ids=np.zeros(n, dtype=np.int32),  # (placeholders: `carried` names every id)
        positions=positions,
        query_start_loc=np.arange(n + 1, dtype=np.int32),
        seq_lens=positions + 1,
        block_tables=tables,
        slot_mapping=slots,
        block_size=block_size,
        sample_seq_indices=list(range(n)),
        sampling=sampling,
        carried=np.asarray([row for _, row in rows], dtype=np.int32),
    )
