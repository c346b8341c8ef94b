"""Tool-call parsers, one module per output format, and the registry that picks one for a model
from its chat template (`--tool-call-parser NAME` overrides)."""

from __future__ import annotations

from lantern.server.tool_parsers import harmony
from lantern.server.tool_parsers.base import CallDelta, ParsedDelta, ToolCall, ToolParser, assemble
from lantern.server.tool_parsers.gemma4 import Gemma4Parser
from lantern.server.tool_parsers.glm import GlmParser
from lantern.server.tool_parsers.harmony import HarmonyParser
from lantern.server.tool_parsers.hermes import HermesParser
from lantern.server.tool_parsers.llama3_json import Llama3JsonParser
from lantern.server.tool_parsers.minimax import MiniMaxParser
from lantern.server.tool_parsers.mistral import MistralParser
from lantern.server.tool_parsers.pythonic import PythonicParser
from lantern.server.tool_parsers.qwen3_coder import Qwen3CoderParser

PARSERS: dict[str, type[ToolParser]] = {
    p.name: p
    for p in (
        HermesParser,
        Llama3JsonParser,
        MistralParser,
        Qwen3CoderParser,
        PythonicParser,
        HarmonyParser,
        GlmParser,
        Gemma4Parser,
        MiniMaxParser,
    )
}
# Other names people use for the same formats (vLLM's among them).
ALIASES = {"qwen": "hermes", "qwen2_5": "hermes", "qwen3": "hermes", "llama3": "llama3_json", "llama": "llama3_json"}
ALIASES |= {"qwen3_xml": "qwen3_coder", "llama4_pythonic": "pythonic", "openai": "harmony", "gpt_oss": "harmony"}
ALIASES |= {"glm47": "glm45", "glm4_moe": "glm45", "glm": "glm45", "minimax": "minimax_m2", "minimax-m2": "minimax_m2"}
CHOICES = sorted([*PARSERS, *ALIASES, "none"])


def parser_named(name: str) -> type[ToolParser] | None:
    """The parser for a --tool-call-parser value; None for "none". KeyError if unknown."""
    if name == "none":
        return None
    return PARSERS[ALIASES.get(name, name)]


def detect(template: str | None) -> type[ToolParser] | None:
    """The format a chat template teaches its model, from the markup it renders tool calls with."""
    t = template or ""
    if harmony.detect(t):
        return HarmonyParser  # gpt-oss: the whole reply is harmony messages, calls included
    if "<minimax:tool_call>" in t:
        return MiniMaxParser  # MiniMax-M2: <invoke> / <parameter> tags inside one block per turn
    if "<|tool_call>" in t and "call:" in t:
        return Gemma4Parser  # Gemma 4's own notation inside <|tool_call>...<tool_call|>
    if "<arg_key>" in t and "<arg_value>" in t:
        return GlmParser  # GLM-4.5 / 4.7: <tool_call> around key-value tags, not JSON
    if "<function=" in t and "<parameter=" in t:
        return Qwen3CoderParser  # its template also has <tool_call>: check it first
    if "<tool_call>" in t:
        return HermesParser
    if "[TOOL_CALLS]" in t:
        return MistralParser
    if "<|python_start|>" in t:
        return PythonicParser
    if "<|python_tag|>" in t or '"parameters": dictionary of argument name' in t:
        return Llama3JsonParser
    return None


__all__ = [
    "ALIASES",
    "CHOICES",
    "PARSERS",
    "CallDelta",
    "ParsedDelta",
    "ToolCall",
    "ToolParser",
    "assemble",
    "detect",
    "parser_named",
]
