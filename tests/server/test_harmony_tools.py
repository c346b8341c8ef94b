"""gpt-oss's harmony format through a real server and the official openai client, on both
backends: the tiny gpt_oss model with our harmony template (tests/fixtures/harmony_template.py).
tool_choice "required" / named are enforced by the harmony grammar, so even a random model calls
a tool with schema-valid arguments; streamed deltas reassemble to the same call; the analysis
channel comes back as reasoning_content and no markup reaches content."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.fixtures.harmony_template import HARMONY, HARMONY_TOKENS, build_harmony_model
from tests.fixtures.tool_templates import render
from tests.server.conftest import start_server
from tests.server.test_tool_calls import ASK, SCHEMAS, TOOLS, reassemble


@pytest.fixture(scope="module")
def harmony_server(tmp_path_factory, backend):
    model = build_harmony_model(tmp_path_factory.mktemp("harmony"))
    threads = {"num_threads": 1} if backend == "torch" else {}  # see tests/server/test_tool_calls.py
    srv = start_server(str(model), backend=backend, **threads)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(harmony_server):
    return openai.OpenAI(base_url=f"{harmony_server.base_url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def brief(harmony_server) -> dict:
    """A random model reasons forever (each step picks <|end|> 1 time in ~400): biasing <|end|>
    plays a model that reasons briefly, so the forced call comes within max_tokens."""
    end = harmony_server.engine.tokenizer.convert_tokens_to_ids("<|end|>")
    return {"logit_bias": {str(end): 12}}


def valid(name: str, arguments: str) -> dict:
    args = json.loads(arguments)
    jsonschema.validate(args, SCHEMAS[name])
    return args


def test_required_makes_a_schema_valid_call(client, brief):
    for seed in range(2):
        r = client.chat.completions.create(
            model="tiny",
            messages=ASK,
            tools=TOOLS,
            tool_choice="required",
            max_tokens=200,
            temperature=1.0,
            seed=seed,
            **brief,
        )
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        (c,) = choice.message.tool_calls
        assert c.id.startswith("call_")
        valid(c.function.name, c.function.arguments)
        assert not any(m in (choice.message.content or "") for m in HARMONY_TOKENS)


def test_named_function_streams_the_same_call(client, brief):
    kw = dict(
        model="tiny",
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=200,
        temperature=0.8,
        seed=3,
        **brief,
    )
    full = client.chat.completions.create(**kw).choices[0]
    assert full.finish_reason == "tool_calls"
    (c,) = full.message.tool_calls
    args = valid("get_weather", c.function.arguments)
    chunks = list(client.chat.completions.create(stream=True, **kw))
    content, calls, finish = reassemble(chunks)
    reasoning = "".join(getattr(ch.choices[0].delta, "reasoning_content", None) or "" for ch in chunks if ch.choices)
    assert finish == "tool_calls" and content == ""
    assert [(n, json.loads(a)) for _, n, a in calls] == [("get_weather", args)]
    assert reasoning == (full.message.reasoning_content or "")


def test_channels_split_without_tools(client, harmony_server):
    """No tools: the reply is still harmony; a Lark grammar naming the markup tokens makes the
    tiny model write an analysis message and a final one (streamed and not)."""
    tok = harmony_server.engine.tokenizer

    def t(text: str) -> str:
        return f"<[{tok.convert_tokens_to_ids(text)}]>"

    grammar = (
        f'start: {t("<|channel|>")} "analysis" {t("<|message|>")} "Think first." {t("<|end|>")} {t("<|start|>")} '
        f'"assistant" {t("<|channel|>")} "final" {t("<|message|>")} "Sunny." {t("<|return|>")}'
    )
    kw = dict(model="tiny", messages=ASK, max_tokens=200, temperature=0)
    kw["extra_body"] = {"structured_outputs": {"grammar": grammar}}
    r = client.chat.completions.create(**kw).choices[0]
    assert (r.message.content, r.message.reasoning_content, r.finish_reason) == ("Sunny.", "Think first.", "stop")
    chunks = [c for c in client.chat.completions.create(stream=True, **kw) if c.choices]
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    reasoning = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks)
    assert (content, reasoning) == ("Sunny.", "Think first.")


def test_conversation_with_a_tool_result(client, harmony_server):
    """The call and the tool's answer go back through the template: the prompt is what
    transformers renders from the same messages."""
    history = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 3}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"forecast": "sunny"}'},
    ]
    r = client.chat.completions.create(model="tiny", messages=history, tools=TOOLS, max_tokens=4, temperature=0)
    tok = harmony_server.engine.tokenizer
    call = {
        **history[1]["tool_calls"][0],
        "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 3}},
    }
    as_template = [*ASK, {**history[1], "content": "", "tool_calls": [call]}, history[2]]
    text = render(tok, HARMONY, as_template, TOOLS, add_generation_prompt=True)
    assert "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>" in text
    assert r.usage.prompt_tokens == len(tok.encode(text, add_special_tokens=False))
