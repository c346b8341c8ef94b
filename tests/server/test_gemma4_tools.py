"""Gemma 4's tool calls (`<|tool_call>call:name{key:<|"|>text<|"|>,n:2}<tool_call|>`: its own notation, not
JSON) through a real server and the official openai client, on both backends: a tiny random model served
with a Gemma-4-shaped template. The parser is picked from the template; tool_choice "required" is forced
in Gemma's notation with schema-typed values; a reply the model writes is split into text and calls, the
`<|tool_response>` hand-over ending it; a call in the history goes back through the template as an object."""

from __future__ import annotations

import json

import openai
import pytest

from tests.fixtures.tool_templates import GEMMA4, render
from tests.server.test_tool_calls import ASK, TOOLS, calls_of, reassemble, tool_model_server


@pytest.fixture(scope="module")
def gemma_server(tmp_path_factory, backend):
    srv = tool_model_server(tmp_path_factory, backend, GEMMA4)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(gemma_server):
    return openai.OpenAI(base_url=f"{gemma_server.base_url}/v1", api_key="unused", max_retries=0)


def test_required_call_in_gemma_notation_streams_alike(client):
    # get_weather only: its city is an enum and days a small integer range, so the forced call ends by the
    # grammar (a free-text string ends when a model chooses to; a random one may not).
    kw = dict(model="tiny", messages=ASK, tools=TOOLS[:1], tool_choice="required", max_tokens=300, temperature=0.8)
    kw.update(seed=3, parallel_tool_calls=False)
    choice = client.chat.completions.create(**kw).choices[0]
    assert choice.finish_reason == "tool_calls", choice.message.content
    calls = calls_of(choice.message)
    assert calls and not choice.message.content
    content, streamed, finish = reassemble(client.chat.completions.create(stream=True, **kw))
    assert (content, finish) == ("", "tool_calls")
    assert [(n, json.loads(a)) for _, n, a in streamed] == calls


def test_auto_parses_a_reply_in_gemma_notation(client):
    reply = 'Checking.<|tool_call>call:get_weather{city:<|"|>Oslo<|"|>,days:2}<tool_call|><|tool_response>'
    kw = dict(model="tiny", messages=ASK, tools=TOOLS, max_tokens=200, temperature=0)
    kw["extra_body"] = {"structured_outputs": {"choice": [reply]}}
    msg = client.chat.completions.create(**kw).choices[0]
    assert msg.finish_reason == "tool_calls"
    assert msg.message.content == "Checking."
    assert calls_of(msg.message) == [("get_weather", {"city": "Oslo", "days": 2})]
    content, streamed, finish = reassemble(client.chat.completions.create(stream=True, **kw))
    assert (content, finish) == ("Checking.", "tool_calls")
    assert [(n, json.loads(a)) for _, n, a in streamed] == [("get_weather", {"city": "Oslo", "days": 2})]


def test_history_call_renders_through_the_template(client, gemma_server):
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Lima"}'}}
    history = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    r = client.chat.completions.create(model="tiny", messages=history, tools=TOOLS, max_tokens=2, temperature=0)
    tok = gemma_server.engine.tokenizer
    as_template = [*ASK, {**history[1], "content": "", "tool_calls": [
        {**call, "function": {"name": "get_weather", "arguments": {"city": "Lima"}}}]}, history[2]]  # fmt: skip
    text = render(tok, GEMMA4, as_template, TOOLS, add_generation_prompt=True)
    assert '<|tool_call>call:get_weather{city:<|"|>Lima<|"|>}<tool_call|>' in text
    assert r.usage.prompt_tokens == len(tok.encode(text, add_special_tokens=False))
