"""Builds the one flattened batch a backend executes per step (vLLM v1 layout) from plain lists.

Prefill chunks and decode tokens are concatenated; sequence i owns tokens
``query_start_loc[i]:query_start_loc[i+1]`` and, after this step, ``seq_lens[i]`` tokens of KV.
A block table may start with -1 entries: blocks behind every layer's sliding window, released to
the pool (BlockManager.release_behind_window); backends never read them, and no slot of this step
lies in one (the tokens computed now are inside their own window).
"""

from __future__ import annotations

import numpy as np

from lantern.app.engine.contract import PromptRows, SamplingRow, ScheduledBatch
from lantern.app.engine.penalty_state import PenaltyState
from lantern.app.engine.scheduler import SchedulerOutput


def build_batch(out: SchedulerOutput, block_size: int, banned: dict[int, list[int]]) -> ScheduledBatch:
    """Flatten the scheduler's choice; `banned` maps seq_id -> token ids it may not draw now."""
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    starts = [0]
    seq_lens: list[int] = []
    tables: list[list[int]] = []
    sample_idx: list[int] = []
    rows: list[SamplingRow] = []
    prompt_rows: list[PromptRows] = []
    for i, item in enumerate(out.scheduled):
        seq, n = item.seq, item.num_new_tokens
        start = seq.num_computed_tokens
        scored = prompt_rows_of(seq, i, starts[-1], start, n)
        if scored is not None:
            prompt_rows.append(scored)
        ids += seq.tokens_range(start, start + n)
        pos = range(start, start + n)
        positions += pos
        table = seq.block_table
        slots += [table[p // block_size] * block_size + p % block_size for p in pos]
        starts.append(starts[-1] + n)
        seq_lens.append(start + n)
        tables.append(table)
        if item.samples:
            sample_idx.append(i)
            if seq.params.uses_penalties and seq.penalty is None:
                # Created once per sequence, then fed token by token by Sequence.append_token.
                seq.penalty = PenaltyState(seq.prompt_token_ids, seq.output_token_ids)
            rows.append(
                SamplingRow(
                    params=seq.params,
                    seed=seq.seed,
                    step=len(seq.output_token_ids),
                    banned_token_ids=banned.get(seq.seq_id, []),
                    penalty=seq.penalty if seq.params.uses_penalties else None,
                )
            )
    held = [item.seq.state_slot for item in out.scheduled]
    return ScheduledBatch(
        input_ids=np.asarray(ids, dtype=np.int32),
        positions=np.asarray(positions, dtype=np.int32),
        query_start_loc=np.asarray(starts, dtype=np.int32),
        seq_lens=np.asarray(seq_lens, dtype=np.int32),
        block_tables=tables,
        slot_mapping=np.asarray(slots, dtype=np.int32),
        block_size=block_size,
        sample_seq_indices=sample_idx,
        sampling=rows,
        state_slots=None if not held or held[0] is None else np.asarray(held, dtype=np.int32),
        prompt_rows=prompt_rows,
    )


def prompt_rows_of(seq, index: int, row: int, start: int, n: int) -> PromptRows | None:
    """The rows of a chunk (positions start .. start + n - 1 at flattened row `row`) that score the prompt token
    after them, for the request's first sample when it asks for prompt_logprobs; None when none do."""
    end = min(start + n, seq.num_prompt_tokens - 1)  # (the last prompt position's logits sample the first token)
    if not seq.scores_prompt or end <= start:
        return None
    return PromptRows(index, row, start, seq.prompt_token_ids[start + 1 : end + 1], seq.params.prompt_logprobs)
