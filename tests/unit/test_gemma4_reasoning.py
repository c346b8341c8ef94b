"""Gemma 4's thought channel, `<|channel>thought\n…<channel|>`, split from the answer as `<think>` blocks
are: the markup read off the template (not harmony's `<|channel|>`), the prompt's state (thinking off
closes an empty channel), every character boundary, a whole chat choice with a Gemma-notation call after
the thought, the forcing grammar's room for the channel (its opener a special token, its label text),
and the thinking budget counting inside the channel. The tokenizer is the tiny one plus Gemma's two
channel markers as special tokens, as Gemma 4's own tokenizer has them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from lantern.app.engine import SamplingParams
from lantern.app.engine.reasoning import GEMMA4, THINK, ReasoningParser, detect, prompt_state
from lantern.app.engine.reasoning_budget import DONE, FORCING, REASONING, ThinkingBudget
from lantern.server.protocol import ChatCompletionRequest
from lantern.server.tool_parsers.request import ChatFormats, chat_setup
from tests.fixtures.harmony_template import HARMONY
from tests.fixtures.tool_templates import GEMMA4 as GEMMA4_TEMPLATE
from tests.fixtures.tool_templates import QWEN3, render
from tests.unit.test_reasoning_parser import split
from tests.unit.test_tool_parsers import accepts

OPEN, END = GEMMA4.opener, GEMMA4.end
CASES = [
    # (opened by the prompt, output, reasoning, content)
    (False, f"{OPEN}thought\nThe user wants 2+2.\n{END}It is 4.", "The user wants 2+2.", "It is 4."),
    (False, f"{OPEN}thought\n{END}<|tool_call>call:f{{}}<tool_call|>", "", "<|tool_call>call:f{}<tool_call|>"),
    (True, f"Add them.\n{END}\n4", "Add them.", "4"),
    (False, f"{OPEN}thought\nnever closed", "never closed", ""),
    (False, f"{OPEN}though", "", f"{OPEN}though"),  # cut inside the opener: text, not reasoning
    (False, f"{OPEN}final\nhi", "", f"{OPEN}final\nhi"),  # another channel is not the thought
    (False, "<think>x</think>y", "", "<think>x</think>y"),  # the other markup stays text
    (False, "Just the answer.", "", "Just the answer."),
]
ASK = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("opened, text, reasoning, content", CASES)
def test_split_at_every_boundary(opened, text, reasoning, content):
    assert split(ReasoningParser(opened, GEMMA4), [text]) == (reasoning, content)
    for i in range(len(text) + 1):
        assert split(ReasoningParser(opened, GEMMA4), [text[:i], text[i:]]) == (reasoning, content), i
    assert split(ReasoningParser(opened, GEMMA4), list(text)) == (reasoning, content)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from tokenizers import AddedToken

    from tests.fixtures.tiny_models import build_tokenizer

    t = build_tokenizer(tmp_path_factory.mktemp("tok"))
    t.add_tokens([AddedToken(OPEN, special=True), AddedToken(END, special=True)], special_tokens=True)
    return t


def test_the_template_names_the_markup_and_the_prompt_its_state(tok):
    assert detect(GEMMA4_TEMPLATE) is GEMMA4 and detect(QWEN3) is THINK
    assert detect(HARMONY) is None  # harmony's <|channel|> is another marker: its own parser splits it

    def state(**kw) -> str | None:
        text = render(tok, GEMMA4_TEMPLATE, ASK, add_generation_prompt=True, **kw)
        return prompt_state(tok, tok.encode(text, add_special_tokens=False), GEMMA4)

    assert state() == "closed"  # thinking off: the generation prompt closes an empty thought channel
    assert state(enable_thinking=True) is None  # on: the model may open the channel
    prefill = render(tok, GEMMA4_TEMPLATE, ASK, add_generation_prompt=True, enable_thinking=True)
    assert prompt_state(tok, tok.encode(prefill + f"{OPEN}thought\n", add_special_tokens=False), GEMMA4) == "open"
    # The <think> reading of the same prompts sees no block either way.
    closed = render(tok, GEMMA4_TEMPLATE, ASK, add_generation_prompt=True)
    assert prompt_state(tok, tok.encode(closed, add_special_tokens=False)) is None


TOOLS = [
    {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {"name": "pong"}},
]


def choice_setup(tok, **kw):
    formats = ChatFormats.resolve(SimpleNamespace(chat_template=GEMMA4_TEMPLATE, tokenizer=tok))
    return formats, chat_setup(formats, ChatCompletionRequest(messages=ASK, **kw))


def test_a_thought_then_a_call_at_every_split(tok):
    formats, setup = choice_setup(tok, tools=TOOLS)
    assert formats.reasoning is GEMMA4 and formats.tool_parser.name == "gemma4"
    params = SamplingParams(max_tokens=8)
    ids = tok.encode(render(tok, GEMMA4_TEMPLATE, ASK, add_generation_prompt=True, enable_thinking=True))
    setup.after_encode(tok, ids, params)
    assert params.skip_special_tokens is False  # the markers are special tokens: decoded for the split
    text = f"{OPEN}thought\nCall ping.\n{END}<|tool_call>call:ping{{}}<tool_call|>"
    for cut in range(len(text) + 1):
        choice = setup.new_choice()
        delta = choice.feed(text[:cut]).then(choice.feed(text[cut:])).then(choice.finish())
        msg = choice.message()
        assert msg["reasoning_content"] == delta.reasoning == "Call ping.", cut
        assert msg["content"] is None and [c["function"]["name"] for c in msg["tool_calls"]] == ["ping"]

    # The flag names the markup too; "none" turns the split off.
    def flagged(template: str, name: str):
        return ChatFormats.resolve(SimpleNamespace(chat_template=template, tokenizer=tok), None, name).reasoning

    assert flagged("{{ messages }}", "gemma4") is GEMMA4 and flagged(GEMMA4_TEMPLATE, "none") is None


def test_a_forced_call_may_think_in_the_channel_first(tok):
    _, setup = choice_setup(tok, tools=TOOLS, tool_choice="required")
    call = "<|tool_call>call:ping{}<tool_call|>"

    def grammar(**kw) -> str:
        params = SamplingParams(max_tokens=8)
        text = render(tok, GEMMA4_TEMPLATE, ASK, add_generation_prompt=True, **kw)
        setup.after_encode(tok, tok.encode(text, add_special_tokens=False), params)
        return params.structured.value

    thinking = grammar(enable_thinking=True)
    assert accepts(tok, thinking, f"{OPEN}thought\nhmm {END}" + call) and accepts(tok, thinking, call)
    assert not accepts(tok, thinking, "<think>hmm</think>" + call)
    assert not accepts(tok, thinking, f"{OPEN}final\nhmm {END}" + call)  # the thought channel, no other
    off = grammar()  # the prompt closed the channel: the call comes at once
    assert accepts(tok, off, call) and not accepts(tok, off, f"{OPEN}thought\nhmm {END}" + call)


PIECES = [OPEN, "thought", "\n", "a", " b", END, "<", "channel|>"]
ID = {p: i for i, p in enumerate(PIECES)}


def test_the_budget_counts_inside_the_channel_and_forces_its_end():
    def decode(token: int) -> str:
        return PIECES[token]

    state = ThinkingBudget(2, [ID[END]], decode, opened=None, markup=GEMMA4)
    forced = []
    for piece in [OPEN, "thought", "\n", "a", END, " b"]:
        forced.append(state.forced_token)
        state.feed(ID[piece])
    # The opener and its label are not counted; the newline and "a" are, then <channel|> is forced.
    assert forced == [None, None, None, None, ID[END], None] and state.phase == DONE
    spelt = ThinkingBudget(5, [ID["<"], ID["channel|>"]], decode, opened="open", markup=GEMMA4)
    assert spelt.phase == REASONING
    for piece in ["a", "<", "channel|>"]:  # the model closes the channel itself, the end spelt in two pieces
        spelt.feed(ID[piece])
    assert spelt.phase == DONE
    zero = ThinkingBudget(0, [ID[END]], decode, opened="open", markup=GEMMA4)
    assert zero.phase == FORCING and zero.forced_token == ID[END]
