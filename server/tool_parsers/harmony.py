"""gpt-oss's harmony format: the whole reply is a run of messages, each a header, `<|message|>`,
a body and an end token. After the prompt's `<|start|>assistant` the model writes e.g.

    <|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary
    to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>

(one line in reality). Channels: `analysis` is reasoning, `final` the answer, `commentary` a
preamble for the user or, with a `to=functions.NAME` recipient, a tool call whose body is the
JSON arguments. The recipient may also sit in the role part (`<|start|>assistant
to=functions.NAME<|channel|>commentary json<|message|>`, how gpt-oss's own template writes
history). Bodies are kept exactly (the template renders them verbatim). The markup tokens are
special tokens in gpt-oss's tokenizer, decoded as text here (request.py turns that on).

Unlike the other formats this parser runs on every reply of a harmony model, tools or not: with
no tools in play (`calls=False`) a call's body is content. Text outside any message, or a header
that is not one, is content verbatim."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lantern.server.tool_parsers.base import CallDelta, ParsedDelta, ToolParser, held_prefix
from lantern.server.tool_parsers.grammar import json_value, lazy_until, params_schema

START, CHANNEL, MESSAGE, END = "<|start|>", "<|channel|>", "<|message|>", "<|end|>"
CALL, RETURN, CONSTRAIN = "<|call|>", "<|return|>", "<|constrain|>"
BODY_ENDS = (END, CALL, RETURN, START)  # a missing <|end|> still ends the body at the next <|start|>
HEADER_OPENS = (START, CHANNEL)
RECIPIENT_OPEN = " to="  # a header may also open with its recipient, right at the reply's start
MAX_HEADER = 256  # a real header is a few dozen characters; past this it is text, not markup
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*(\w+)")


def detect(template: str | None) -> bool:
    t = template or ""
    return CHANNEL in t and MESSAGE in t


@dataclass
class HarmonyDelta(ParsedDelta):
    reasoning: str = ""

    def extend(self, other: ParsedDelta) -> HarmonyDelta:
        super().extend(other)
        self.reasoning += getattr(other, "reasoning", "")
        return self


class HarmonyParser(ToolParser):
    name = "harmony"
    markers = (START, CHANNEL, MESSAGE, END, CALL, RETURN, CONSTRAIN)

    def __init__(
        self, tools: list[dict[str, Any]] | None = None, template: str | None = None, calls: bool = True
    ) -> None:
        super().__init__(tools, template)
        self.calls_on = calls
        self.state = "text"
        self.kind = ""  # the current body: "reasoning", "content" or "call"
        self.args_sent = False
        self.fresh = True  # at the reply's start a header may begin with its recipient (` to=...`)

    def feed(self, text: str) -> HarmonyDelta:
        self.buf += text
        return self._run(final=False)

    def finish(self) -> HarmonyDelta:
        return self._run(final=True)

    def _run(self, final: bool) -> HarmonyDelta:
        out = HarmonyDelta()
        while getattr(self, "_" + self.state)(out, final):
            pass
        return out

    def _text(self, out: HarmonyDelta, final: bool) -> bool:
        """Outside a message: content until something that opens a header."""
        if self.fresh:
            if self.buf.startswith(RECIPIENT_OPEN):
                self.state = "header"
                return True
            if RECIPIENT_OPEN.startswith(self.buf) and not final:
                return False  # maybe the recipient, still arriving
            self.fresh = False
        hits = [i for i in (self.buf.find(m) for m in HEADER_OPENS) if i >= 0]
        if hits:
            i = min(hits)
            out.content += self.buf[:i]
            self.buf, self.state = self.buf[i:], "header"
            return True
        held = 0 if final else max(held_prefix(self.buf, m) for m in HEADER_OPENS)
        out.content += self.buf[: len(self.buf) - held]
        self.buf = self.buf[len(self.buf) - held :]
        return False

    def _header(self, out: HarmonyDelta, final: bool) -> bool:
        i = self.buf.find(MESSAGE)
        head = self.buf if i < 0 else self.buf[:i]
        if "\n" in head or len(head) > MAX_HEADER or (i < 0 and final):
            # Not a header after all: its first character is text, look again after it.
            out.content += self.buf[0]
            self.buf, self.state, self.fresh = self.buf[1:], "text", False
            return True
        if i < 0:
            return False
        self.fresh = False
        self.buf, self.state = self.buf[i + len(MESSAGE) :], "body"
        recipient = _RECIPIENT.search(head)
        channel = _CHANNEL.search(head)
        target = recipient.group(1) if recipient else ""
        if channel is not None and channel.group(1) == "analysis" and not target:
            self.kind = "reasoning"
        elif target.startswith("functions.") and self.calls_on:
            self.kind, self.args_sent = "call", False
            out.calls.append(CallDelta(self.num_calls, self.new_id(), target[len("functions.") :]))
        else:
            self.kind = "content"  # final, a commentary preamble, or a call nobody asked to parse
        return True

    def _emit(self, out: HarmonyDelta, text: str) -> None:
        if not text:
            return
        if self.kind == "reasoning":
            out.reasoning += text
        elif self.kind == "call":
            out.calls.append(CallDelta(self.num_calls, arguments=text))
            self.args_sent = True
        else:
            out.content += text

    def _body(self, out: HarmonyDelta, final: bool) -> bool:
        hits = [(j, m) for m in BODY_ENDS if (j := self.buf.find(m)) >= 0]
        if not hits:
            held = 0 if final else max(held_prefix(self.buf, m) for m in BODY_ENDS)
            self._emit(out, self.buf[: len(self.buf) - held])
            self.buf = self.buf[len(self.buf) - held :]
            if final:
                self._end_message(out)
            return False
        j, marker = min(hits)
        self._emit(out, self.buf[:j])
        self._end_message(out)
        # <|start|> opens the next header; the end tokens are consumed.
        self.buf = self.buf[j:] if marker == START else self.buf[j + len(marker) :]
        self.state = "text"
        return True

    def _end_message(self, out: HarmonyDelta) -> None:
        if self.kind == "call":
            if not self.args_sent:
                out.calls.append(CallDelta(self.num_calls, arguments="{}"))
            self.num_calls += 1
        self.kind = ""

    @classmethod
    def grammar(cls, tools: list[dict[str, Any]], parallel: bool, lit: Callable[[str], str], template: str = "") -> str:
        """One call, after an optional analysis message: a harmony turn ends at `<|call|>` (a stop
        token), so `parallel` cannot give more than one call per reply."""
        alts = [
            f"call_{i}: {lit(CHANNEL)} {json.dumps('commentary to=functions.' + t['name'] + ' ')} "
            f'{lit(CONSTRAIN)} "json" {lit(MESSAGE)} {json_value(params_schema(t))} {lit(CALL)}'
            for i, t in enumerate(tools)
        ]
        calls = " | ".join(f"call_{i}" for i in range(len(tools)))
        return f"calls: analysis? ({calls})\n" + "\n".join(alts) + "\n" + _analysis_rules(lit)

    @classmethod
    def reply_rules(cls, lit: Callable[[str], str]) -> str:
        """`reply` for tool_choice auto with strict functions: a final answer or a call (the calls
        rule above), after an optional analysis message."""
        text = lazy_until(RETURN, lit)
        rule = "final_text" if text.startswith("/(.|\\n)*/ <[") else "final_text[lazy]"
        return (
            f'reply: calls | analysis? final\nfinal: {lit(CHANNEL)} "final" {lit(MESSAGE)} final_text\n{rule}: {text}\n'
        )


def _analysis_rules(lit: Callable[[str], str]) -> str:
    text = lazy_until(END, lit)
    rule = "analysis_text" if text.startswith("/(.|\\n)*/ <[") else "analysis_text[lazy]"
    return (
        f'analysis: {lit(CHANNEL)} "analysis" {lit(MESSAGE)} analysis_text {lit(START)} "assistant"\n{rule}: {text}\n'
    )
