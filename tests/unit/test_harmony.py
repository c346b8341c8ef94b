"""gpt-oss's harmony format (server/tool_parsers/harmony.py): replies written the way our harmony
template (tests/fixtures/harmony_template.py) renders assistant turns, fed whole, split at every
character boundary and one character at a time: the same reasoning, content and calls every way,
and no markup in content. The forcing grammar accepts what the template renders and, sampled at
random through llguidance, only produces calls the parser reads back with schema-valid arguments."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest

from lantern.server.tool_parsers import PARSERS, detect, parser_named
from lantern.server.tool_parsers.base import assemble
from lantern.server.tool_parsers.grammar import check_grammar, literal_maker, tool_grammar
from lantern.server.tool_parsers.harmony import HarmonyDelta, HarmonyParser
from tests.fixtures.harmony_template import HARMONY, HARMONY_TOKENS, add_harmony_tokens
from tests.fixtures.tool_templates import model_reply
from tests.unit.test_tool_parsers import ASK, NOTE, TOOLS, accepts, sample

OPENAI_TOOLS = [{"type": "function", "function": t} for t in TOOLS]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from tests.fixtures.tiny_models import build_tokenizer

    return add_harmony_tokens(build_tokenizer(tmp_path_factory.mktemp("tok")))


def call(name: str, args: dict, i: int = 0) -> dict:
    return {"id": f"call{i}", "type": "function", "function": {"name": name, "arguments": args}}


# (reasoning, content, calls) of one assistant turn.
REPLIES = {
    "answer": ("", "Paris is sunny.", []),
    "reasoning then answer": ("The user wants weather.\nAnswer briefly.", "Sunny <b>today</b>.", []),
    "one call": ("", "", [call("get_weather", {"city": "Paris", "days": 3})]),
    "reasoning then call": ("Need the tool.", "", [call("get_weather", {"city": "Oslo", "days": 2})]),
    "no arguments": ("", "", [call("ping", {})]),
    "tricky strings": ("a < b", "", [call("save_note", {"text": 'a"}\\<b>', "tags": ["a"]})]),
    "unicode": ("", "", [call("get_weather", {"city": "São Paulo", "days": 1, "metric": True})]),
}


def reply_text(tok, reasoning: str, content: str, calls: list[dict]) -> str:
    msg = {"role": "assistant", "content": content, "tool_calls": calls}
    if reasoning:
        msg["thinking"] = reasoning
    return model_reply(tok, HARMONY, ASK, msg, "<|call|>" if calls else "<|return|>", OPENAI_TOOLS)


def run(pieces: list[str], tools=TOOLS, calls: bool = True):
    p = HarmonyParser(tools, HARMONY, calls=calls)
    d = HarmonyDelta()
    for piece in pieces:
        d.extend(p.feed(piece))
    d.extend(p.finish())
    return (d.reasoning, d.content, [(c.name, json.loads(c.arguments)) for c in assemble(d.calls)]), d


def every_split(text: str):
    yield [text]
    yield list(text)
    for i in range(len(text) + 1):
        yield [text[:i], text[i:]]


@pytest.mark.parametrize("label", list(REPLIES))
def test_template_replies_parse_alike_at_every_split(tok, label):
    reasoning, content, calls = REPLIES[label]
    text = reply_text(tok, reasoning, content, calls)
    want = (reasoning, content, [(c["function"]["name"], c["function"]["arguments"]) for c in calls])
    for pieces in every_split(text):
        got, d = run(pieces)
        assert got == want, (pieces, text)
        assert not any(m in d.content or m in d.reasoning for m in HARMONY_TOKENS)
    # OpenAI's stream shape: a call's first piece carries id and name, later ones arguments only.
    firsts = [c for c in d.calls if c.id is not None]
    assert [c.index for c in firsts] == list(range(len(calls)))
    assert all(c.name and c.arguments == "" for c in firsts)


def test_other_header_shapes_and_end_tokens():
    """The recipient in the role part (gpt-oss's own template writes history calls that way),
    a commentary preamble before the call, a `json` content type without <|constrain|>, and the
    stop token's text left in (when special tokens reach the parser undecoded-away)."""
    cases = {
        ' to=functions.ping<|channel|>commentary json<|message|>{"x": 1}<|call|>': ("", "", [("ping", {"x": 1})]),
        "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>commentary "
        "to=functions.ping <|constrain|>json<|message|>{}<|call|>": ("", "Checking.", [("ping", {})]),
        "<|channel|>analysis<|message|>hm<|end|><|start|>assistant<|channel|>final<|message|>Hi.<|return|>": (
            "hm",
            "Hi.",
            [],
        ),
        # An empty body is a call without arguments.
        "<|channel|>commentary to=functions.ping <|constrain|>json<|message|>": ("", "", [("ping", {})]),
    }
    for text, want in cases.items():
        for pieces in every_split(text):
            assert run(pieces)[0] == want, (pieces, text)


def test_streamed_arguments_arrive_in_pieces():
    text = '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Oslo", "days": 2}'
    _, d = run(list(text))
    fragments = [c.arguments for c in d.calls if c.id is None]
    assert len(fragments) > 10 and "".join(fragments) == '{"city": "Oslo", "days": 2}'


@pytest.mark.parametrize(
    "text",
    [
        "Plain text without markup.",
        "Compare a<|chan and b",
        "x <|channel|>final\nnot a header<|message|>y",
        "<|start|>assistant<|channel|>final",  # a header cut short
        "I want to=go home",
    ],
)
def test_text_that_is_no_markup_is_content_verbatim(text):
    for pieces in every_split(text):
        assert run(pieces)[0] == ("", text, []), pieces


def test_without_tools_a_call_body_is_content():
    """tool_choice none / no tools: the channels are still split (no markup reaches content), and
    a call the model writes anyway is not parsed: its body is content."""
    text = "<|channel|>analysis<|message|>r<|end|><|start|>assistant"
    text += "<|channel|>commentary to=functions.ping <|constrain|>json<|message|>{}"
    for pieces in every_split(text):
        assert run(pieces, tools=[], calls=False)[0] == ("r", "{}", [])


def test_registry():
    assert detect(HARMONY) is HarmonyParser and PARSERS["harmony"] is HarmonyParser
    assert parser_named("openai") is HarmonyParser and parser_named("gpt_oss") is HarmonyParser
    from tests.fixtures.tool_templates import TEMPLATES

    assert all(detect(t) is not HarmonyParser for t in TEMPLATES.values())


# -- forcing grammar -----------------------------------------------------------------------------


def grammar(tok, tools: list[dict]) -> str:
    lit = literal_maker(tok)
    g = tool_grammar(HarmonyParser.grammar(tools, True, lit, HARMONY), lit)
    check_grammar(g)
    return g


def test_markers_are_named_as_special_tokens(tok):
    g = grammar(tok, TOOLS)
    assert "<|channel|>" not in g and f"<[{tok.convert_tokens_to_ids('<|call|>')}]>" in g


def test_grammar_accepts_what_the_template_renders(tok):
    for label in ("one call", "reasoning then call", "no arguments", "tricky strings", "unicode"):
        reasoning, _, calls = REPLIES[label]
        text = reply_text(tok, reasoning, "", calls) + "<|call|>"
        assert accepts(tok, grammar(tok, TOOLS), text), text
    one = reply_text(tok, "", "", REPLIES["one call"][2]) + "<|call|>"
    assert not accepts(tok, grammar(tok, [NOTE]), one)  # named: another function is refused
    assert not accepts(tok, grammar(tok, TOOLS), one.replace("Paris", "Rome"))  # not in the enum
    assert not accepts(tok, grammar(tok, TOOLS), reply_text(tok, "", "Sunny.", []) + "<|return|>")


def test_sampled_forced_calls_parse_with_valid_arguments(tok):
    rng = random.Random(7)
    g = grammar(tok, TOOLS)
    schemas = {t["name"]: t.get("parameters", {"type": "object", "maxProperties": 0}) for t in TOOLS}
    for _ in range(6):
        text = sample(tok, g, rng, max_steps=3000)  # free analysis text ends at a 1-in-400 token
        (_, content, calls), _ = run([text])
        assert content == "" and len(calls) == 1, text
        jsonschema.validate(calls[0][1], schemas[calls[0][0]])


def test_strict_auto_grammar_allows_an_answer_or_a_valid_call(tok):
    lit = literal_maker(tok)
    g = tool_grammar(HarmonyParser.grammar(TOOLS, True, lit), lit, reply=HarmonyParser.reply_rules(lit))
    check_grammar(g)
    answer = reply_text(tok, "Think.", "Sunny.", []) + "<|return|>"
    one = reply_text(tok, "", "", REPLIES["one call"][2]) + "<|call|>"
    assert accepts(tok, g, answer) and accepts(tok, g, one)
    assert not accepts(tok, g, one.replace("Paris", "Rome"))
