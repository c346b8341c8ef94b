"""A thinking-token budget (vLLM's `thinking_token_budget`, sglang's `thinking_budget`, llama.cpp's
`--reasoning-budget`): once a sequence has written `budget` tokens inside its reasoning block
(`<think>`, or Gemma 4's thought channel: the engine's reasoning.ReasoningMarkup), the block's end
marker (`</think>`, `<channel|>`) is forced, token by token, so the model goes on to its answer.

Where the block is follows the reasoning split (app/engine/reasoning.py), so that what is counted
is what front ends show as reasoning: a prompt that ends inside `<think>` starts the output in
reasoning; otherwise the output reasons only if it opens with `<think>` (after whitespace); a
prompt that ends after a closed block (thinking switched off) never reasons. One block per output.
Only the tokens between the markers count. A model that closes its block before the budget is left
alone; a budget of 0 closes the block at once. A model that never writes `<think>` never reasons:
its budget holds trivially.

Markers are found in text (each token decoded with special tokens kept), so a marker that is one
special token and one spelt in several tokens are both seen. The forced marker is the tokenizer's
own encoding of `</think>`: a one-token allow-list per step in SamplingRow.token_bitmask, the mask
structured output already sends to both backends' samplers, ANDed with the row's grammar /
allowed_token_ids mask. Tool-call grammars leave room for the block and its end (the marker is
allowed there), and so do the chat routes' structured outputs on a reasoning model (the constraint
starts after the block: server/structured.after_reasoning). A constraint that still forbids the
marker where the budget runs out (a completions prompt that ends inside `<think>`) cannot be
followed together with the budget: the request fails with an error naming thinking_token_budget,
as a grammar dead end fails naming its field.

Cost: only sequences with a budget are tracked; for the others a step costs one empty-dict check.
A state catches up on its sequence's new tokens before each of its sampling steps rather than
being fed after sampling, so a retried step or a preemption by recompute sees the same tokens.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from lantern.app.engine.errors import InvalidRequestError
from lantern.app.engine.reasoning import THINK, ReasoningMarkup, prompt_state
from lantern.app.engine.structured import pack_allowed

logger = logging.getLogger(__name__)

START, REASONING, FORCING, DONE = "start", "reasoning", "forcing", "done"


class ThinkingBudget:
    """One sequence's budget: fed its output tokens in order, it says which token must come next.

    `opened`: reasoning.prompt_state of the prompt ("open", "closed" or None)."""

    def __init__(
        self,
        budget: int,
        end_ids: list[int],
        decode: Callable[[int], str],
        opened: str | None = None,
        markup: ReasoningMarkup = THINK,
    ):
        self.budget = budget
        self.markup = markup
        self.tail_chars = 4 * len(markup.end)  # enough to spot the end marker split over any tokens
        self.end_ids = end_ids
        self.decode = decode
        self.count = 0  # reasoning tokens so far
        self.forced = 0  # end-marker tokens forced so far
        self.seen = 0  # output tokens fed
        self.text = ""  # START: the output so far (whitespace dropped); REASONING: its tail
        self.phase = DONE if opened == "closed" or not end_ids else START
        if opened == "open" and end_ids:
            self._reason("")

    def _reason(self, after: str) -> None:
        """The block is open; `after` is text that came with the opening token."""
        self.phase, self.text = REASONING, after
        if self.markup.end in after:
            self.phase = DONE
        elif self.count >= self.budget:  # a budget of 0
            self.phase = FORCING

    @property
    def forced_token(self) -> int | None:
        """The token the next step must produce, or None when sampling is free."""
        return self.end_ids[self.forced] if self.phase == FORCING else None

    def catch_up(self, output_ids: list[int]) -> None:
        while self.seen < len(output_ids) and self.phase != DONE:
            self.feed(output_ids[self.seen])

    def feed(self, token: int) -> None:
        self.seen += 1
        if self.phase == START:
            body, start = (self.text + self.decode(token)).lstrip(), self.markup.start
            if body.startswith(start):
                self._reason(body[len(start) :])
            elif start.startswith(body):  # nothing but whitespace yet, or part of the marker
                self.text = body
            else:
                self.phase = DONE  # the output is the answer: no block to budget
        elif self.phase == REASONING:
            self.text = (self.text + self.decode(token))[-self.tail_chars :]
            if self.markup.end in self.text:
                self.phase = DONE  # closed by the model before the budget ran out
                return
            self.count += 1
            if self.count >= self.budget:
                self.phase = FORCING
        elif self.phase == FORCING:
            if token != self.end_ids[self.forced]:  # the mask allows nothing else: a broken invariant
                logger.warning("thinking budget: forced token %d, got %d", self.end_ids[self.forced], token)
                self.phase = DONE
                return
            self.forced += 1
            if self.forced == len(self.end_ids):
                self.phase = DONE


class ThinkingBudgets:
    """The engine's budgets, one per sequence whose params set thinking_token_budget.

    `vocab`: the width of the token masks (GrammarCompiler.vocab), so a forced token's mask and a
    grammar's combine word for word."""

    def __init__(self, tokenizer: Any, vocab: int, markup: ReasoningMarkup = THINK):
        self.tokenizer = tokenizer
        self.vocab = vocab
        self.markup = markup
        self.states: dict[int, tuple[Any, ThinkingBudget]] = {}  # seq_id -> (Sequence, its budget)
        self._end_ids: list[int] | None = None
        self._masks: dict[int, np.ndarray] = {}

    def end_ids(self) -> list[int]:
        if self._end_ids is None:
            self._end_ids = list(self.tokenizer.encode(self.markup.end, add_special_tokens=False))
        return self._end_ids

    def _decode(self, token: int) -> str:
        return self.tokenizer.decode([token], skip_special_tokens=False)

    def track(self, seqs: list[Any]) -> None:
        """Start budgets for a new request's sequences (the n samples share their params and prompt)."""
        budget = seqs[0].params.thinking_token_budget if seqs else None
        if budget is None:
            return
        for seq_id in [k for k, (seq, _) in self.states.items() if seq.is_finished]:
            del self.states[seq_id]  # finished or aborted since: nothing else removes them
        opened = prompt_state(self.tokenizer, seqs[0].prompt_token_ids, self.markup)
        for seq in seqs:
            state = ThinkingBudget(budget, self.end_ids(), self._decode, opened, self.markup)
            if state.phase != DONE:
                self.states[seq.seq_id] = (seq, state)

    def force(self, rows: list[Any], seqs: list[Any]) -> None:
        """Restrict each row whose sequence must write the end marker now to that one token
        (rows: this step's SamplingRows, after the grammar masks; seqs: their sequences)."""
        if not self.states:
            return
        for row, seq in zip(rows, seqs, strict=True):
            entry = self.states.get(seq.seq_id)
            if entry is None:
                continue
            state = entry[1]
            state.catch_up(seq.output_token_ids)
            token = state.forced_token
            if state.phase == DONE:
                del self.states[seq.seq_id]
            if token is None:
                continue
            mask = self._one_hot(token)
            if row.token_bitmask is not None:
                mask = np.bitwise_and(mask, row.token_bitmask)
                if not mask.any():
                    raise InvalidRequestError(
                        f"thinking_token_budget: the reasoning block must end here ({self.markup.end!r}), but the "
                        "request's output constraint does not allow that token; the two cannot be combined",
                        param="thinking_token_budget",
                    )
            row.token_bitmask = mask

    def _one_hot(self, token: int) -> np.ndarray:
        mask = self._masks.get(token)
        if mask is None:
            mask = self._masks[token] = pack_allowed([token], self.vocab)
        return mask
