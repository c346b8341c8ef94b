"""Penalty inputs of one sequence, kept up to date token by token.

Repetition penalty needs the set of token ids seen so far (prompt and output); frequency and
presence penalties need how often each generated id occurred. Rebuilding those from the full
histories every step costs O(prompt + output) with a sort per penalized row; this state costs
O(1) per generated token, and the sampler reads it as numpy views without rescanning anything.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np


class _GrowArray:
    """Append-only int64 array with amortized O(1) appends and a zero-copy view of its contents."""

    def __init__(self, capacity: int = 16) -> None:
        self._data = np.zeros(capacity, dtype=np.int64)
        self.size = 0

    def append(self, value: int) -> int:
        if self.size == self._data.shape[0]:
            self._data = np.concatenate([self._data, np.zeros_like(self._data)])
        self._data[self.size] = value
        self.size += 1
        return self.size - 1

    def increment(self, index: int) -> None:
        self._data[index] += 1

    def view(self) -> np.ndarray:
        return self._data[: self.size]


class PenaltyState:
    """Unique prompt ids (once), output id counts, and output ids absent from the prompt."""

    def __init__(self, prompt_token_ids: Sequence[int], output_token_ids: Iterable[int] = ()) -> None:
        self.prompt_ids = np.unique(np.asarray(prompt_token_ids, dtype=np.int64))  # sorted
        self._out_ids = _GrowArray()  # each generated id once, in first-seen order
        self._out_counts = _GrowArray()  # parallel to _out_ids
        self._slot: dict[int, int] = {}  # generated id -> its index in _out_ids
        self._new_ids = _GrowArray()  # generated ids that the prompt does not contain
        self.num_output = 0
        for token in output_token_ids:
            self.append(token)

    def _in_prompt(self, token: int) -> bool:
        i = int(np.searchsorted(self.prompt_ids, token))
        return i < self.prompt_ids.shape[0] and int(self.prompt_ids[i]) == token

    def append(self, token: int) -> None:
        """Record one generated token (called by Sequence.append_token)."""
        self.num_output += 1
        slot = self._slot.get(token)
        if slot is not None:
            self._out_counts.increment(slot)
            return
        self._slot[token] = self._out_ids.append(token)
        self._out_counts.append(1)
        if not self._in_prompt(token):
            self._new_ids.append(token)

    def output_ids(self) -> np.ndarray:
        """Distinct generated ids (int64 view; do not modify)."""
        return self._out_ids.view()

    def output_counts(self) -> np.ndarray:
        """How often each id of output_ids() was generated (int64 view)."""
        return self._out_counts.view()

    def seen_ids(self) -> np.ndarray:
        """Distinct ids of prompt and output together (what repetition_penalty applies to)."""
        return np.concatenate([self.prompt_ids, self._new_ids.view()])
