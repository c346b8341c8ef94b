"""The thinking-token budget's state machine (app/engine/reasoning_budget.py): which tokens count,
when `</think>` is forced and how (one token per step, a multi-token marker in order), and the mask
it puts on a sampling row, alone and combined with a grammar's. A toy vocabulary stands in for a
tokenizer: each id decodes to a fixed piece of text."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from lantern.app.engine import InvalidRequestError, SamplingParams
from lantern.app.engine.reasoning_budget import DONE, FORCING, REASONING, START, ThinkingBudget, ThinkingBudgets
from lantern.app.engine.structured import pack_allowed, unpack_mask

PIECES = ["<think>", "</think>", "a", " b", "\n", "</", "think", ">", "<", " ", "<th", "ink>", "x</think>y"]
ID = {p: i for i, p in enumerate(PIECES)}
OPEN, CLOSE, A, B, NL, C1, C2, C3 = (ID[p] for p in ("<think>", "</think>", "a", " b", "\n", "</", "think", ">"))
VOCAB = len(PIECES)


def decode(token: int) -> str:
    return PIECES[token]


class ToyTokenizer:
    """encode / decode as LLMEngine's tokenizer offers them; `</think>` is one token or three."""

    def __init__(self, split_marker: bool = False):
        self.end = [C1, C2, C3] if split_marker else [CLOSE]

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        assert text == "</think>"
        return list(self.end)

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(PIECES[i] for i in ids)


def run(state: ThinkingBudget, tokens: list[int]) -> list[int | None]:
    """Feed tokens one by one; the forced token before each (None: free)."""
    forced = []
    for t in tokens:
        forced.append(state.forced_token)
        state.feed(t)
    return forced


def test_counts_reasoning_tokens_then_forces_the_marker():
    state = ThinkingBudget(3, [CLOSE], decode, opened="open")
    assert state.phase == REASONING
    forced = run(state, [A, B, A, CLOSE, A, A])
    assert forced == [None, None, None, CLOSE, None, None]
    assert state.count == 3 and state.phase == DONE


def test_a_multi_token_marker_is_forced_token_by_token():
    state = ThinkingBudget(2, [C1, C2, C3], decode, opened="open")
    forced = run(state, [A, NL, C1, C2, C3, B])
    assert forced == [None, None, C1, C2, C3, None]
    assert state.count == 2 and state.phase == DONE  # the marker's own tokens are not reasoning


def test_a_model_that_opens_the_block_starts_counting_there():
    state = ThinkingBudget(2, [CLOSE], decode, opened=None)
    forced = run(state, [NL, ID[" "], OPEN, A, B, CLOSE, A])  # layout before the block is not reasoning
    assert forced == [None, None, None, None, None, CLOSE, None]
    assert state.count == 2


def test_an_opener_spelt_in_pieces_is_seen():
    state = ThinkingBudget(1, [CLOSE], decode, opened=None)
    run(state, [ID["<th"], ID["ink>"]])
    assert state.phase == REASONING and state.count == 0
    assert run(state, [A, CLOSE]) == [None, CLOSE]


def test_an_answer_without_a_block_is_never_touched():
    state = ThinkingBudget(0, [CLOSE], decode, opened=None)
    assert run(state, [A, OPEN, A, A]) == [None] * 4  # `<think>` after the answer began is answer text
    assert state.phase == DONE
    closed = ThinkingBudget(0, [CLOSE], decode, opened="closed")  # thinking switched off in the prompt
    assert closed.phase == DONE and closed.forced_token is None


@pytest.mark.parametrize("close", [[CLOSE], [C1, C2, C3], [ID["x</think>y"]]])
def test_a_model_that_closes_early_is_left_alone(close):
    state = ThinkingBudget(5, [CLOSE], decode, opened="open")
    assert run(state, [A, B, *close, A, A, A, A, A]) == [None] * (7 + len(close))
    assert state.phase == DONE


def test_budget_zero_closes_at_once():
    opened = ThinkingBudget(0, [C1, C2, C3], decode, opened="open")
    assert run(opened, [C1, C2, C3, A]) == [C1, C2, C3, None]
    own = ThinkingBudget(0, [CLOSE], decode, opened=None)
    assert run(own, [OPEN, CLOSE, A]) == [None, CLOSE, None]
    assert own.count == 0


def test_catch_up_feeds_each_token_once():
    state = ThinkingBudget(3, [CLOSE], decode, opened="open")
    out = [A, B]
    state.catch_up(out)
    state.catch_up(out)  # a retried step sees the same tokens
    assert state.count == 2 and state.phase == REASONING
    out.append(A)
    state.catch_up(out)
    assert state.phase == FORCING and state.forced_token == CLOSE


def seq(seq_id: int, budget: int | None, prompt: list[int], out: list[int] | None = None) -> SimpleNamespace:
    params = SimpleNamespace(thinking_token_budget=budget)
    return SimpleNamespace(
        seq_id=seq_id, params=params, prompt_token_ids=prompt, output_token_ids=out or [], is_finished=False
    )


def row(mask: np.ndarray | None = None) -> SimpleNamespace:
    return SimpleNamespace(token_bitmask=mask)


def allowed(r: SimpleNamespace) -> list[int]:
    return list(np.flatnonzero(unpack_mask(r.token_bitmask, VOCAB)))


def test_rows_are_masked_only_when_a_token_is_forced():
    budgets = ThinkingBudgets(ToyTokenizer(), VOCAB)
    free = seq(1, None, [A, OPEN])
    budgets.track([free])
    assert budgets.states == {}  # no budget: nothing tracked, force() returns at once
    s = seq(2, 1, [A, OPEN])  # the prompt opens the block
    budgets.track([s])
    rows = [row(), row()]
    budgets.force(rows, [free, s])
    assert rows[0].token_bitmask is None and rows[1].token_bitmask is None
    s.output_token_ids.append(A)
    rows = [row(), row()]
    budgets.force(rows, [free, s])
    assert rows[0].token_bitmask is None and allowed(rows[1]) == [CLOSE]
    s.output_token_ids += [CLOSE, B]
    budgets.force([row()], [s])
    assert 2 not in budgets.states  # done: dropped, so later steps pay nothing for it


def test_forced_tokens_in_order_on_rows():
    budgets = ThinkingBudgets(ToyTokenizer(split_marker=True), VOCAB)
    s = seq(7, 1, [A, OPEN])
    budgets.track([s])
    seen = []
    for token in [A, None, None, None, B]:
        r = row()
        budgets.force([r], [s])
        seen.append(None if r.token_bitmask is None else allowed(r))
        s.output_token_ids.append(token if token is not None else allowed(r)[0])
    assert seen == [None, [C1], [C2], [C3], None]


def test_the_forced_token_narrows_a_grammar_mask_or_fails_naming_the_field():
    budgets = ThinkingBudgets(ToyTokenizer(), VOCAB)
    s = seq(3, 0, [OPEN])
    budgets.track([s])
    r = row(pack_allowed([A, CLOSE, B], VOCAB))  # a grammar with room for the end of the block
    budgets.force([r], [s])
    assert allowed(r) == [CLOSE]
    t = seq(4, 0, [OPEN])
    budgets.track([t])
    with pytest.raises(InvalidRequestError) as exc:
        budgets.force([row(pack_allowed([A, B], VOCAB))], [t])  # JSON from the first token: no room
    assert exc.value.param == "thinking_token_budget"


def test_samples_of_one_request_have_their_own_budgets_and_finished_ones_are_dropped():
    budgets = ThinkingBudgets(ToyTokenizer(), VOCAB)
    a, b = seq(10, 1, [OPEN]), seq(11, 1, [OPEN])
    budgets.track([a, b])
    a.output_token_ids.append(A)
    rows = [row(), row()]
    budgets.force(rows, [a, b])
    assert allowed(rows[0]) == [CLOSE] and rows[1].token_bitmask is None
    a.is_finished = b.is_finished = True  # aborted mid-reasoning
    budgets.track([seq(12, 5, [A])])
    assert set(budgets.states) == {12} and budgets.states[12][1].phase == START


@pytest.mark.parametrize("bad", [-1, 1.5, "x", True, 2**31])
def test_sampling_params_refuse_a_bad_budget_naming_it(bad):
    with pytest.raises(InvalidRequestError) as exc:
        SamplingParams(thinking_token_budget=bad)
    assert exc.value.param == "thinking_token_budget" and "thinking_token_budget" in str(exc.value)


def test_sampling_params_take_a_budget():
    assert SamplingParams().thinking_token_budget is None
    assert SamplingParams(thinking_token_budget=0).thinking_token_budget == 0
    assert SamplingParams(thinking_token_budget=4096).thinking_token_budget == 4096
