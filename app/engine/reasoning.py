"""Reasoning split from the answer: `<think>…</think>` (Qwen3, QwQ, DeepSeek-R1 and its distills) and
Gemma 4's thought channel, `<|channel>thought\n…<channel|>` (ReasoningMarkup names a model's markers).

The reasoning block may open in the output (`<think>` first, Qwen3) or in the prompt (the
template ends the generation prompt with `<think>`: R1 distills, Qwen3 thinking-2507), so the
output starts inside it. Which one is read off the prompt's tail, not guessed from the output.
Qwen3 with `enable_thinking: false` ends the prompt with an empty, closed block: the output is
all answer. The parser is fed text pieces and returns (reasoning, content) pieces; whitespace
around the markers is layout and dropped, like the markers.

Part of the engine's public API (not the server's) so that every front end splits reasoning the
same way: the OpenAI routes, and the terminal chat running the engine in-process."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

THINK_START, THINK_END = "<think>", "</think>"


@dataclass(frozen=True)
class ReasoningMarkup:
    """How a model marks its reasoning block. `label` follows the opener as ordinary text (Gemma 4
    opens with the special token `<|channel>` then the channel's name, "thought"), so `start`, the
    text that opens a block, is opener + label; `markers` are the texts that may be special tokens."""

    name: str
    opener: str
    end: str
    label: str = ""

    @property
    def start(self) -> str:
        return self.opener + self.label

    @property
    def markers(self) -> tuple[str, str]:
        return (self.opener, self.end)


THINK = ReasoningMarkup("think", THINK_START, THINK_END)
GEMMA4 = ReasoningMarkup("gemma4", "<|channel>", "<channel|>", "thought")
NAMES = {"think": THINK, "qwen3": THINK, "deepseek_r1": THINK, "qwq": THINK, "gemma4": GEMMA4}
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


def detect(template: str | None) -> ReasoningMarkup | None:
    """The reasoning markup of the model a chat template belongs to, None when it writes none.
    Gemma 4's templates name its channel opener (the generation prompt closes an empty thought
    channel when thinking is off; earlier turns' thoughts are stripped); harmony's `<|channel|>`
    is a different marker and is not matched."""
    text = template or ""
    if GEMMA4.opener in text:
        return GEMMA4
    return THINK if THINK_END in text or THINK_START in text else None


def prompt_state(tokenizer: Any, prompt_ids: list[int], markup: ReasoningMarkup = THINK) -> str | None:
    """The prompt's end: "open" when it ends inside a reasoning block (the output starts reasoning),
    "closed" when it ends right after one (thinking switched off: the output is the answer),
    None when the output may or may not open one."""
    tail = tokenizer.decode(prompt_ids[-16:], skip_special_tokens=False).rstrip()
    if tail.endswith(markup.start):
        return "open"
    return "closed" if tail.endswith(markup.end) else None


def markers_are_special(tokenizer: Any, markup: ReasoningMarkup = THINK) -> bool:
    """Whether the tokenizer has the markup's markers as special tokens, which decoding with
    skip_special_tokens would drop (the split then needs them decoded)."""
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    special = {str(getattr(t, "content", t)) for t in added.values() if getattr(t, "special", False)}
    return any(m in special for m in markup.markers)


def prompt_opens_reasoning(tokenizer: Any, prompt_ids: list[int], markup: ReasoningMarkup = THINK) -> bool:
    return prompt_state(tokenizer, prompt_ids, markup) == "open"


class ReasoningParser:
    def __init__(self, in_reasoning: bool = False, markup: ReasoningMarkup = THINK) -> None:
        self.markup = markup
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
                body, start = self.buf.lstrip(), self.markup.start
                if not final and (not body or (len(body) < len(start) and start.startswith(body))):
                    break  # cannot tell yet whether the output opens a block
                if body.startswith(start):
                    self.buf, self.state, self.lead = body[len(start) :], "reasoning", True
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
            before, after = _split_at(self.buf, self.markup.end)
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
