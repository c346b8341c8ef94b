"""Incremental detokenization and stop-string matching.

Decoding a growing token list one token at a time is wrong for byte-level BPE (a character can span
tokens) and for SentencePiece (leading spaces depend on the previous token). We decode a small
window ending at the new tokens and emit only text that is complete (no trailing U+FFFD).
"""

from __future__ import annotations

from typing import Any


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Any, prompt_token_ids: list[int], skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = list(prompt_token_ids[-6:])  # context for the first tokens' spacing
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.text = ""

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, token_id: int) -> str:
        """Append one token; returns the newly completed text (may be empty)."""
        self.ids.append(token_id)
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.ids[self.prefix_offset :])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            delta = full[len(prefix) :]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            self.text += delta
            return delta
        return ""


class StopStringMatcher:
    """Finds stop strings across token boundaries and holds back text that may begin one."""

    def __init__(self, stops: list[str], include_stop: bool = False):
        self.stops = stops
        self.include_stop = include_stop
        self.max_len = max((len(s) for s in stops), default=0)

    def check(self, text: str, new_len: int, floor: int = 0) -> tuple[str | None, int]:
        """Given the full text whose last `new_len` chars are new: (matched stop, cut position).

        Without a match the cut position is how much of the text is safe to emit now. `floor`
        is text already emitted (before min_tokens allowed stops): a stop may not start inside
        it and nothing before it is held back, so the streamed text always equals the final one.
        """
        if not self.stops:
            return None, len(text)
        search_from = max(len(text) - new_len - self.max_len + 1, floor, 0)
        best: tuple[int, str] | None = None
        for stop in self.stops:
            i = text.find(stop, search_from)
            if i != -1 and (best is None or i < best[0]):
                best = (i, stop)
        if best is not None:
            i, stop = best
            return stop, i + len(stop) if self.include_stop else i
        # Hold back the longest suffix that is a proper prefix of some stop string. Only tail
        # positions holding the stop's first character can start one (linear, not quadratic,
        # in the stop's length).
        hold = 0
        for stop in self.stops:
            start = max(len(text) - len(stop) + 1, floor)
            i = text.find(stop[0], start)
            while i != -1 and len(text) - i > hold:
                if stop.startswith(text[i:]):
                    hold = len(text) - i
                    break
                i = text.find(stop[0], i + 1)
        return None, len(text) - hold
