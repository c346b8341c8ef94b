"""GLM-4.5's tool calls (`<tool_call>name` + `<arg_key>` / `<arg_value>` tags, not JSON) and `<think>`
reasoning through a real server and the official openai client, on both backends: a tiny random model
served with a GLM-4.5-shaped template. The parser is picked from the template (its `<tool_call>` would
otherwise read as hermes JSON and the calls would come back as text); tool_choice "required" is forced
by GLM's own markup; a call in the history goes back through the template as an object."""

from __future__ import annotations

import json

import openai
import pytest

from tests.fixtures.tool_templates import GLM_45, render
from tests.server.test_tool_calls import ASK, TOOLS, calls_of, reassemble, tool_model_server

# GLM-4.5's generation prompt: thinking on, or an empty closed block when enable_thinking is false.
GLM_THINKING = GLM_45.replace(
    "{%- if add_generation_prompt %}<|assistant|>{%- endif %}",
    "{%- if add_generation_prompt %}<|assistant|>"
    "{%- if enable_thinking is defined and not enable_thinking %}\n<think></think>{%- endif %}{%- endif %}",
)
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def glm_server(tmp_path_factory, backend):
    srv = tool_model_server(tmp_path_factory, backend, GLM_THINKING)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(glm_server):
    return openai.OpenAI(base_url=f"{glm_server.base_url}/v1", api_key="unused", max_retries=0)


def test_required_call_in_glm_markup_streams_alike(client):
    # get_weather only: GLM writes strings raw, so a free-text value ends when the model chooses (a
    # random model may not); the enum city and integer days end by the grammar. The tiny BPE spends a
    # token on nearly every character: a call takes ~150.
    kw = dict(model="tiny", messages=ASK, tools=TOOLS[:1], tool_choice="required", max_tokens=400, temperature=0.8)
    kw.update(seed=3, parallel_tool_calls=False, extra_body=NO_THINKING)
    choice = client.chat.completions.create(**kw).choices[0]
    assert choice.finish_reason == "tool_calls", choice.message.content
    calls = calls_of(choice.message)
    assert calls and not choice.message.content
    content, streamed, finish = reassemble(client.chat.completions.create(stream=True, **kw))
    assert (content, finish) == ("", "tool_calls")
    assert [(n, json.loads(a)) for _, n, a in streamed] == calls


def test_auto_parses_glm_calls_and_reasoning_from_the_output(client):
    """What a GLM-4.5 writes after its generation prompt: reasoning, a sentence, a key-value call."""
    reply = (
        "\n<think>Use the tool.</think>\nChecking.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
        "<arg_value>Oslo</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>"
    )
    kw = dict(model="tiny", messages=ASK, tools=TOOLS, max_tokens=200, temperature=0)
    kw["extra_body"] = {"structured_outputs": {"choice": [reply]}}
    msg = client.chat.completions.create(**kw).choices[0]
    assert msg.finish_reason == "tool_calls"
    assert (msg.message.content, msg.message.reasoning_content) == ("Checking.", "Use the tool.")
    assert calls_of(msg.message) == [("get_weather", {"city": "Oslo", "days": 2})]  # 2 typed by the schema
    content, streamed, finish = reassemble(client.chat.completions.create(stream=True, **kw))
    assert (content, finish) == ("Checking.", "tool_calls")
    assert [(n, json.loads(a)) for _, n, a in streamed] == [("get_weather", {"city": "Oslo", "days": 2})]


def test_history_call_renders_through_the_template(client, glm_server):
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Lima"}'}}
    history = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    r = client.chat.completions.create(model="tiny", messages=history, tools=TOOLS, max_tokens=2, temperature=0)
    tok = glm_server.engine.tokenizer
    as_template = [*ASK, {**history[1], "content": "", "tool_calls": [
        {**call, "function": {"name": "get_weather", "arguments": {"city": "Lima"}}}]}, history[2]]  # fmt: skip
    text = render(tok, GLM_THINKING, as_template, TOOLS, add_generation_prompt=True)
    assert "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Lima</arg_value>" in text
    assert r.usage.prompt_tokens == len(tok.encode(text, add_special_tokens=False))
