"""Reasoning split from the answer (`<think>` blocks opened in the output or in the prompt), at
every character boundary; and one chat choice's whole pipeline: reasoning, then content and
tool calls, with parallel_tool_calls, tool_choice and the special-token stop text."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from lantern.app.engine import InvalidRequestError, SamplingParams, StructuredSpec
from lantern.app.engine.reasoning import ReasoningParser, detect, prompt_opens_reasoning
from lantern.server.protocol import ChatCompletionRequest
from lantern.server.tool_parsers.request import ChatFormats, chat_setup
from tests.fixtures.tool_templates import HERMES, QWEN3, R1_STYLE, render

CASES = [
    # (opened by the prompt, output, reasoning, content)
    (False, "<think>\nThe user wants 2+2.\n</think>\n\nIt is 4.", "The user wants 2+2.", "It is 4."),
    (True, "Add them: 4.\n</think>\n\n4", "Add them: 4.", "4"),
    (False, "  Just the answer, <think>not reasoning</think>", "", "  Just the answer, <think>not reasoning</think>"),
    (False, "<think>\nnever closed (max_tokens)", "never closed (max_tokens)", ""),
    (True, "cut short </thi", "cut short </thi", ""),
    (False, "<thi", "", "<thi"),
    (False, "<think></think>", "", ""),
    (False, "", "", ""),
]


def split(parser: ReasoningParser, pieces: list[str]) -> tuple[str, str]:
    reasoning = content = ""
    for piece in pieces:
        r, c = parser.feed(piece)
        reasoning, content = reasoning + r, content + c
    r, c = parser.finish()
    return reasoning + r, content + c


@pytest.mark.parametrize("opened, text, reasoning, content", CASES)
def test_split_at_every_boundary(opened, text, reasoning, content):
    assert split(ReasoningParser(opened), [text]) == (reasoning, content)
    for i in range(len(text) + 1):
        assert split(ReasoningParser(opened), [text[:i], text[i:]]) == (reasoning, content), i
    assert split(ReasoningParser(opened), list(text)) == (reasoning, content)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from tests.fixtures.tiny_models import build_tokenizer

    return build_tokenizer(tmp_path_factory.mktemp("tok"))


def test_the_prompt_says_whether_the_output_starts_reasoning(tok):
    ask = [{"role": "user", "content": "hi"}]

    def opens(template: str, **kw) -> bool:
        text = render(tok, template, ask, add_generation_prompt=True, **kw)
        return prompt_opens_reasoning(tok, tok.encode(text, add_special_tokens=False))

    assert opens(R1_STYLE)  # the generation prompt ends with <think>
    assert not opens(QWEN3)  # Qwen3 opens the block itself, in the output
    assert not opens(QWEN3, enable_thinking=False)  # closed, empty block: the output is the answer
    assert render(tok, QWEN3, ask, add_generation_prompt=True, enable_thinking=False).endswith("</think>\n\n")
    assert detect(QWEN3) and detect(R1_STYLE) and not detect(HERMES)


# -- one choice end to end (no server) -----------------------------------------------------------

TOOLS = [
    {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {"name": "pong"}},
]


def formats(tok, template: str, **flags) -> ChatFormats:
    return ChatFormats.resolve(SimpleNamespace(chat_template=template, tokenizer=tok), **flags)


def request(**kw) -> ChatCompletionRequest:
    return ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], **kw)


def run_choice(setup, text: str, cut: int) -> tuple[dict, str]:
    choice = setup.new_choice()
    pieces = choice.feed(text[:cut]).then(choice.feed(text[cut:])).then(choice.finish())
    streamed = pieces.as_delta()
    msg = choice.message()
    # The stream's pieces add up to the message.
    assert streamed.get("reasoning_content", "") == (msg.get("reasoning_content") or "")
    assert streamed.get("content", "") == (msg["content"] or "")
    calls = streamed.get("tool_calls", [])
    assert [(c["id"], c["function"]["name"]) for c in calls] == [
        (c["id"], c["function"]["name"]) for c in msg.get("tool_calls", [])
    ]
    return msg, choice.finish_reason("stop")


def test_reasoning_then_tool_calls(tok):
    f = formats(tok, QWEN3)
    assert f.tool_parser.name == "hermes" and f.reasoning
    text = (
        '<think>\nCall both.\n</think>\n\n<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>\n'
        '<tool_call>\n{"name": "pong", "arguments": {}}\n</tool_call>'
    )
    for parallel, names in ((None, ["ping", "pong"]), (False, ["ping"])):
        setup = chat_setup(f, request(tools=TOOLS, parallel_tool_calls=parallel))
        for cut in range(len(text) + 1):
            msg, reason = run_choice(setup, text, cut)
            assert msg["reasoning_content"] == "Call both." and msg["content"] is None
            assert [c["function"]["name"] for c in msg["tool_calls"]] == names and reason == "tool_calls"
    # tool_choice none: the tools are not rendered and markup stays text.
    setup = chat_setup(f, request(tools=TOOLS, tool_choice="none"))
    assert setup.template_kwargs({"enable_thinking": True}) == {"enable_thinking": True}
    msg, reason = run_choice(setup, text, 5)
    assert "<tool_call>" in msg["content"] and "tool_calls" not in msg and reason == "stop"


def test_flags_override_the_template(tok):
    f = formats(tok, QWEN3, tool_parser="mistral", reasoning_parser="none")
    assert f.tool_parser.name == "mistral" and not f.reasoning
    assert formats(tok, "{{ messages }}").tool_parser is None
    with pytest.raises(InvalidRequestError) as e:
        chat_setup(formats(tok, "{{ messages }}"), request(tools=TOOLS))
    assert e.value.param == "tools"


def test_tool_choice_forces_a_grammar(tok):
    f = formats(tok, HERMES)
    ids = tok.encode("prompt", add_special_tokens=False)
    named = chat_setup(f, request(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "pong"}}))
    params = SamplingParams(max_tokens=8)
    named.after_encode(tok, ids, params)
    assert params.structured.kind == "lark" and params.structured.param == "tools"
    assert '"pong"' in params.structured.value and '"ping"' not in params.structured.value
    required = chat_setup(f, request(tools=TOOLS, tool_choice="required"))
    assert required.parallel and [t["name"] for t in required.forced] == ["ping", "pong"]
    both = SamplingParams(max_tokens=8, structured=StructuredSpec("regex", "a+", param="response_format"))
    with pytest.raises(InvalidRequestError) as e:
        required.after_encode(tok, ids, both)
    assert e.value.param == "tool_choice" and "response_format" in e.value.message
    auto = chat_setup(f, request(tools=TOOLS))
    plain = SamplingParams(max_tokens=8)
    auto.after_encode(tok, ids, plain)
    assert plain.structured is None and auto.template_kwargs(None)["tools"] == TOOLS


def test_special_marker_tokens_are_decoded_and_the_stop_text_dropped(tok):
    # In the tiny tokenizer <|im_start|> is special: a format whose marker it is must see it.
    f = formats(tok, HERMES)
    f.special = f.special | {"<tool_call>"}
    setup = chat_setup(f, request(tools=TOOLS))
    params = SamplingParams(max_tokens=8)
    setup.after_encode(tok, [1, 2], params)
    assert params.skip_special_tokens is False and setup.strip_special_stop
    eos = tok.eos_token_id
    out = SimpleNamespace(finished=True, finish_reason="stop", stop_reason=None, token_ids=[5, eos])
    choice = setup.new_choice()
    assert choice.visible("hi</s>", out, tok) == "hi"
    assert choice.visible("hi", SimpleNamespace(**{**vars(out), "finish_reason": "length"}), tok) == "hi"
