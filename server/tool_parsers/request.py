"""Tools and reasoning for one chat request: which parsers run, what the template is given, the
grammar that forces a call (tool_choice "required" or a named function), and the splitter that
turns each choice's text into reasoning, content and tool-call deltas."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lantern.app.engine import InvalidRequestError, SamplingParams, StructuredSpec, reasoning
from lantern.app.engine.reasoning import ReasoningMarkup, ReasoningParser
from lantern.server.structured import after_reasoning
from lantern.server.tool_parsers import detect, parser_named
from lantern.server.tool_parsers.base import CallDelta, ToolParser, assemble
from lantern.server.tool_parsers.grammar import check_grammar, literal_maker, text_or_calls, tool_grammar
from lantern.server.tool_parsers.harmony import HarmonyParser
from lantern.server.tool_parsers.harmony import detect as harmony_detect

logger = logging.getLogger(__name__)


@dataclass
class ChatFormats:
    """Per server: the tool-call format and reasoning markup of the served model."""

    tool_parser: type[ToolParser] | None
    reasoning: ReasoningMarkup | None  # the model's reasoning block markers; None: it writes none
    template: str
    lit: Callable[[str], str]
    special: frozenset[str]  # special-token texts of the tokenizer
    # A parser that runs on every reply, tools or not, because the whole reply is its markup
    # (harmony: reasoning, answer and calls are all channel messages).
    channels: type[ToolParser] | None = None

    @classmethod
    def resolve(cls, engine: Any, tool_parser: str | None = None, reasoning_parser: str | None = None) -> ChatFormats:
        """Flags win; otherwise the chat template says (see tool_parsers.detect, reasoning.detect)."""
        template = getattr(engine, "chat_template", None) or ""
        parser = parser_named(tool_parser) if tool_parser else detect(template)
        if reasoning_parser:
            thinks = None if reasoning_parser == "none" else reasoning.NAMES[reasoning_parser]
        else:
            thinks = reasoning.detect(template)
        tok = engine.tokenizer
        added = getattr(tok, "added_tokens_decoder", {}) or {}
        special = frozenset(str(getattr(t, "content", t)) for t in added.values() if getattr(t, "special", False))
        logger.info(
            "chat formats: tool calls %s, reasoning %s",
            parser.name if parser else "off",
            f"{thinks.start!r} blocks" if thinks else "off",
        )
        harmony = parser is HarmonyParser or (tool_parser in (None, "none") and harmony_detect(template))
        if harmony:
            logger.info("chat formats: harmony channels (analysis -> reasoning_content, final -> content)")
        return cls(parser, thinks, template, literal_maker(tok), special, HarmonyParser if harmony else None)


@dataclass
class ChatSetup:
    formats: ChatFormats
    tools: list[dict[str, Any]] = field(default_factory=list)  # function definitions in play
    parser: type[ToolParser] | None = None
    forced: list[dict[str, Any]] | None = None  # a call among these is forced
    strict: bool = False  # tool_choice auto with a strict function: calls must follow the schemas
    parallel: bool = True
    in_reasoning: bool = False
    strip_special_stop: bool = False  # we turned special tokens on; the stop token's text goes
    answer_spec: StructuredSpec | None = None  # the request's constraint, when wrapped after the reasoning

    def template_kwargs(self, user: dict[str, Any] | None) -> dict[str, Any] | None:
        if not self.parser:
            return user
        return {**(user or {}), "tools": [{"type": "function", "function": t} for t in self.tools]}

    def after_encode(self, tokenizer: Any, prompt_ids: list[int], params: SamplingParams) -> None:
        """What depends on the rendered prompt: whether the output starts inside reasoning, the
        forcing grammar, and decoding special tokens when a marker is one."""
        f = self.formats
        state = reasoning.prompt_state(tokenizer, prompt_ids, f.reasoning) if f.reasoning else "closed"
        self.in_reasoning = state == "open"
        markers = (*(self.parser.markers if self.parser else ()), *(f.reasoning.markers if f.reasoning else ()))
        markers += f.channels.markers if f.channels else ()
        if params.skip_special_tokens and any(m in f.special for m in markers):
            params.skip_special_tokens = False
            self.strip_special_stop = True
        if self.parser is None or (self.forced is None and not self.strict):
            if params.structured is not None and f.reasoning and f.channels is None and state != "closed":
                # response_format etc. shape the answer, not the reasoning: the block comes first
                self.answer_spec = params.structured
                params.structured = after_reasoning(params.structured, f.lit, f.reasoning, self.in_reasoning)
            return
        if params.structured is not None:
            why = "tool_choice forces a tool call" if self.forced is not None else "strict functions shape the reply"
            raise InvalidRequestError(
                f"{why}, which cannot be combined with {params.structured.param}",
                param="tool_choice" if self.forced is not None else "tools",
            )
        tools, reply = self.forced, ""
        if tools is None:  # auto + strict: text, or calls that follow the schemas
            tools = self.tools
            own = getattr(self.parser, "reply_rules", None)  # formats whose plain answer is markup too
            reply = (
                own(f.lit) if own else text_or_calls(f.lit, getattr(self.parser, "open_marker", ""), self.parser.anchor)
            )
        think = f.reasoning if state != "closed" else None  # room to reason first
        try:
            rules = self.parser.grammar(tools, self.parallel, f.lit, f.template)
            grammar = tool_grammar(rules, f.lit, think, in_think=self.in_reasoning, reply=reply)
        except (TypeError, ValueError, AttributeError, KeyError) as exc:  # schemas shaped oddly
            raise InvalidRequestError(
                f"tools: a function's parameters could not be made into a grammar: {exc!r}", param="tools"
            ) from None
        check_grammar(grammar)
        params.structured = StructuredSpec("lark", grammar, param="tools")

    def new_choice(self) -> ChoiceOutput:
        return ChoiceOutput(self)


def chat_setup(formats: ChatFormats, body: Any) -> ChatSetup:
    """The request's tool and reasoning handling (body: a ChatCompletionRequest, already checked
    by refuse_unsupported for names and tool_choice consistency)."""
    setup = ChatSetup(formats)
    choice = body.tool_choice
    if not body.tools or choice == "none":
        return setup  # tool_choice "none": the tools are neither shown to the model nor parsed
    if formats.tool_parser is None:
        raise InvalidRequestError(
            "tools: this model's chat template has no tool-call format Lantern recognizes; "
            "start the server with --tool-call-parser to name one",
            param="tools",
        )
    setup.parser = formats.tool_parser
    setup.tools = [t.function.model_dump(exclude_none=True) for t in body.tools]
    setup.parallel = body.parallel_tool_calls is not False
    if choice == "required":
        setup.forced = setup.tools
    elif choice in (None, "auto"):
        # OpenAI's strict: the function's arguments follow its schema exactly. Enforced by a
        # grammar that still lets the model answer in text; every function's schema applies then.
        setup.strict = any(t.get("strict") for t in setup.tools)
    elif choice not in (None, "auto"):  # a named function: exactly one call of it
        setup.forced = [t for t in setup.tools if t["name"] == choice.function.name]
        setup.parallel = False
    return setup


@dataclass
class ChoiceDelta:
    reasoning: str = ""
    content: str = ""
    calls: list[CallDelta] = field(default_factory=list)

    def then(self, later: ChoiceDelta) -> ChoiceDelta:
        return ChoiceDelta(self.reasoning + later.reasoning, self.content + later.content, self.calls + later.calls)

    def as_delta(self) -> dict[str, Any]:
        """The OpenAI stream delta: a call's first piece carries index, id, type and name."""
        out: dict[str, Any] = {}
        if self.reasoning:
            out["reasoning_content"] = self.reasoning
        if self.content:
            out["content"] = self.content
        entries: list[dict[str, Any]] = []
        for c in self.calls:
            if c.id is not None:
                fn = {"name": c.name, "arguments": c.arguments}
                entries.append({"index": c.index, "id": c.id, "type": "function", "function": fn})
            elif entries and entries[-1]["index"] == c.index:
                entries[-1]["function"]["arguments"] += c.arguments
            else:
                entries.append({"index": c.index, "function": {"arguments": c.arguments}})
        if entries:
            out["tool_calls"] = entries
        return out


class ChoiceOutput:
    """One choice's text split into reasoning, content and tool calls, piece by piece."""

    def __init__(self, setup: ChatSetup) -> None:
        self.setup = setup
        markup = setup.formats.reasoning
        self.reasoner = ReasoningParser(setup.in_reasoning, markup) if markup else None
        self.tools = setup.parser(setup.tools, setup.formats.template) if setup.parser else None
        if self.tools is None and setup.formats.channels is not None:  # no tools: still split the channels
            self.tools = setup.formats.channels(None, setup.formats.template, calls=False)
        self.max_calls = None if setup.parallel else 1
        self.reasoning_text, self.content = "", ""
        self.calls: list[CallDelta] = []

    def visible(self, text: str, out: Any, tokenizer: Any) -> str:
        """`text` minus the stop token's own text, when special tokens are decoded only because
        a marker is one (`out`: the CompletionOutput that produced the text)."""
        if not (self.setup.strip_special_stop and out.finished and out.finish_reason == "stop" and out.token_ids):
            return text
        if out.stop_reason is not None and not isinstance(out.stop_reason, int):
            return text  # a stop string: the engine already cut it
        last = tokenizer.decode([out.token_ids[-1]], skip_special_tokens=False)
        return text[: -len(last)] if last and last in self.setup.formats.special and text.endswith(last) else text

    def feed(self, text: str) -> ChoiceDelta:
        return self._route(*(self.reasoner.feed(text) if self.reasoner else ("", text)), final=False)

    def finish(self) -> ChoiceDelta:
        return self._route(*(self.reasoner.finish() if self.reasoner else ("", "")), final=True)

    def _route(self, reasoning_text: str, content: str, final: bool) -> ChoiceDelta:
        calls: list[CallDelta] = []
        if self.tools is not None:
            parsed = self.tools.feed(content)
            if final:
                parsed.extend(self.tools.finish())
            content = parsed.content
            reasoning_text += getattr(parsed, "reasoning", "")  # harmony's analysis channel
            # parallel_tool_calls false: only the first call counts.
            calls = [c for c in parsed.calls if self.max_calls is None or c.index < self.max_calls]
        self.reasoning_text += reasoning_text
        self.content += content
        self.calls += calls
        return ChoiceDelta(reasoning_text, content, calls)

    def finish_reason(self, reason: str | None) -> str | None:
        return "tool_calls" if self.calls and reason == "stop" else reason

    def message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.calls:
            msg["content"] = self.content or None
            msg["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in assemble(self.calls)
            ]
        if self.reasoner is not None or self.setup.formats.channels is not None:
            msg["reasoning_content"] = self.reasoning_text or None
        return msg
