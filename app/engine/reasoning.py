"""Reasoning split from the answer: `<think>…</think>` (Qwen3, QwQ, DeepSeek-R1 and its distills).

The reasoning block may open in the output (`<think>` first, Qwen3) or in the prompt (the
template ends the generation prompt with `<think>`: R1 distills, Qwen3 thinking-2507), so the
output starts inside it. Which one is read off the prompt's tail, not guessed from the output.
Qwen3 with `enable_thinking: false` ends the prompt with an empty, closed block: the output is
all answer. The parser is fed text pieces and returns (reasoning, content) pieces; whitespace
around the markers is layout and dropped, like the markers.

Part of the engine's public API (not the server's) so that every front end splits reasoning the
same way: the OpenAI routes, and the terminal chat running the engine in-process."""

from __future__ import annotations

from typing import Any

THINK_START, THINK_END = "<think>", "</think>"
NAMES = {"think": "think", "qwen3": "think", "deepseek_r1": "think", "qwq": "think"}
CHOICES = sorted([*NAMES, "none"])


def _split_at(text: str, marker: str) -> tuple[str, str | None]:
    """(text safe to emit before `marker`, the text after it or None when it is not there yet).
    Without the marker, a tail that could be its start is held back."""
    i = text.find(marker)
    if i >= 0:
        return text[:i], text[i + len(marker) :]
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return text[:-n], None
    return text, None


def detect(template: str | None) -> bool:
    """Whether a chat template belongs to a model that writes `<think>` blocks."""
    return THINK_END in (template or "") or THINK_START in (template or "")


def prompt_state(tokenizer: Any, prompt_ids: list[int]) -> str | None:
    """The prompt's end: "open" when it ends inside a `<think>` block (the output starts reasoning),
    "closed" when it ends right after one (thinking switched off: the output is the answer),
    None when the output may or may not open one."""
    tail = tokenizer.decode(prompt_ids[-16:], skip_special_tokens=False).rstrip()
    if tail.endswith(THINK_START):
        return "open"
    return "closed" if tail.endswith(THINK_END) else None


def markers_are_special(tokenizer: Any) -> bool:
    """Whether the tokenizer has `<think>`/`</think>` as special tokens, which decoding with
    skip_special_tokens would drop (the split then needs them decoded)."""
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    special = {str(getattr(t, "content", t)) for t in added.values() if getattr(t, "special", False)}
    return THINK_START in special or THINK_END in special


def prompt_opens_reasoning(tokenizer: Any, prompt_ids: list[int]) -> bool:
    return prompt_state(tokenizer, prompt_ids) == "open"


class ReasoningParser:
    markers = (THINK_START, THINK_END)

    def __init__(self, in_reasoning: bool = False) -> None:
        self.state = "reasoning" if in_reasoning else "start"
        self.buf = ""
        self.lead = True  # whitespace at the start of the current part is layout

    def feed(self, text: str) -> tuple[str, str]:
        self.buf += text
        return self._run(final=False)

    def finish(self) -> tuple[str, str]:
        return self._run(final=True)

    def _run(self, final: bool) -> tuple[str, str]:
        reasoning = content = ""
        while True:
            if self.state == "start":
                body = self.buf.lstrip()
                if not final and (not body or (len(body) < len(THINK_START) and THINK_START.startswith(body))):
                    break  # cannot tell yet whether the output opens a block
                if body.startswith(THINK_START):
                    self.buf, self.state, self.lead = body[len(THINK_START) :], "reasoning", True
                else:
                    self.state, self.lead = "content", False  # no block: the text is the answer as is
                continue
            if self.lead:
                stripped = self.buf.lstrip()
                if not stripped and not final:
                    self.buf = ""
                    break
                self.buf, self.lead = stripped, False
            if self.state == "content":
                content += self.buf
                self.buf = ""
                break
            before, after = _split_at(self.buf, THINK_END)
            if after is not None:
                reasoning += before.rstrip()
                self.buf, self.state, self.lead = after, "content", True
                continue
            if final:
                reasoning += self.buf.rstrip()
                self.buf = ""
                break
            # Hold back trailing whitespace (dropped if the end marker follows) and a partial marker.
            safe = before.rstrip()
            reasoning += safe
            self.buf = self.buf[len(safe) :]
            break
        return reasoning, content
