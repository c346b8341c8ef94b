"""Tool calling and reasoning through a real server and the official openai client, on both
backends: a tiny random model with a Qwen3-style template (hermes `<tool_call>` blocks and
`<think>` reasoning). tool_choice "required" / named are enforced by a grammar, so even a random
model calls the tool with schema-valid arguments; streamed deltas reassemble to the same calls."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from tests.fixtures.tool_templates import QWEN3, render
from tests.server.conftest import start_server

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "metric": {"type": "boolean"},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
NOTE = {
    "type": "object",
    "properties": {"text": {"type": "string", "maxLength": 12}},
    "required": ["text"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "save_note", "parameters": NOTE}},
]
SCHEMAS = {"get_weather": WEATHER, "save_note": NOTE}
ASK = [{"role": "user", "content": "What is the weather in Paris for three days?"}]
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def long_context_model(tmp_path_factory) -> str:
    """The tiny llama with room for a tools system prompt (the tiny BPE spends ~900 tokens on it)."""
    from tests.fixtures.tiny_models import build_model

    return str(build_model("llama2", tmp_path_factory.mktemp("tools"), max_position_embeddings=4096))


@pytest.fixture(scope="module")
def tool_server(long_context_model, backend):
    # One torch thread: on a shared 2-core box more threads make each step ~10x slower.
    threads = {"num_threads": 1} if backend == "torch" else {}
    srv = start_server(long_context_model, backend=backend, chat_template=QWEN3, **threads)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(tool_server):
    return openai.OpenAI(base_url=f"{tool_server.base_url}/v1", api_key="unused", max_retries=0)


def check_calls(calls, names=None) -> list[tuple[str, dict]]:
    out = []
    for c in calls:
        assert c.type == "function" and c.id.startswith("call_")
        args = json.loads(c.function.arguments)
        jsonschema.validate(args, SCHEMAS[c.function.name])
        out.append((c.function.name, args))
    if names is not None:
        assert [n for n, _ in out] == names
    return out


def tool_model_server(tmp_path_factory, backend: str, template: str):
    """A server of the tiny llama with room for a tools system prompt, speaking through `template` (the
    format tests of other model families: GLM, Gemma 4)."""
    from tests.fixtures.tiny_models import build_model

    model = build_model("llama2", tmp_path_factory.mktemp("tool_format"), max_position_embeddings=4096)
    threads = {"num_threads": 1} if backend == "torch" else {}
    return start_server(str(model), backend=backend, chat_template=template, **threads)


def calls_of(message) -> list[tuple[str, dict]]:
    """A reply's calls as (name, arguments), each checked against its function's schema."""
    out = []
    for c in message.tool_calls or []:
        args = json.loads(c.function.arguments)
        jsonschema.validate(args, SCHEMAS[c.function.name])
        out.append((c.function.name, args))
    return out


def reassemble(chunks) -> tuple[str, list[tuple[str, str, str]], str | None]:
    """Content, [(id, name, arguments)] and finish reason from streamed chunks, as a client
    accumulates them: a call's first delta brings id and name, later ones argument text."""
    content, calls, finish = "", {}, None
    for chunk in chunks:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for d in choice.delta.tool_calls or []:
            if d.index not in calls:
                assert d.id and d.function.name, "a call's first delta carries its id and name"
                calls[d.index] = [d.id, d.function.name, ""]
            else:
                assert d.id is None and d.function.name is None
            calls[d.index][2] += d.function.arguments or ""
        finish = choice.finish_reason or finish
    return content, [tuple(calls[i]) for i in sorted(calls)], finish


def test_required_makes_a_schema_valid_call(client):
    r = client.chat.completions.create(
        model="tiny",
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=120,
        temperature=0,
        extra_body=NO_THINKING,
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert len(check_calls(choice.message.tool_calls)) == 1


def test_named_function_streams_the_same_call(client):
    kw = dict(
        model="tiny",
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=100,
        temperature=0.8,
        seed=7,
        extra_body=NO_THINKING,
    )
    full = client.chat.completions.create(**kw).choices[0]
    assert full.finish_reason == "tool_calls"
    (name, args), *_ = check_calls(full.message.tool_calls, ["get_weather"])
    content, calls, finish = reassemble(client.chat.completions.create(stream=True, **kw))
    assert content == "" and finish == "tool_calls"
    assert [(n, json.loads(a)) for _, n, a in calls] == [(name, args)]


def test_sampled_required_calls_are_valid(client):
    """Several seeds, parallel calls allowed: every call the model finishes validates."""
    for seed in range(2):
        r = client.chat.completions.create(
            model="tiny",
            messages=ASK,
            tools=TOOLS,
            tool_choice="required",
            max_tokens=150,
            temperature=1.0,
            seed=seed,
            extra_body=NO_THINKING,
        )
        choice = r.choices[0]
        calls = choice.message.tool_calls
        assert calls, choice.message.content
        if choice.finish_reason == "tool_calls":
            check_calls(calls)
        else:  # cut by max_tokens inside a later call: the earlier ones are whole
            assert choice.finish_reason == "length"
            check_calls(calls[:-1])


def test_conversation_with_a_tool_result(client, tool_server):
    """The assistant's call and the tool's answer go back through the model's own template: the
    prompt is exactly what transformers renders from the same messages and tools."""
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
    tok = tool_server.engine.tokenizer
    as_template = [
        *ASK,
        {**history[1], "content": "", "tool_calls": [{**history[1]["tool_calls"][0], "function": {
            "name": "get_weather", "arguments": {"city": "Paris", "days": 3}}}]},
        history[2],
    ]  # fmt: skip
    text = render(tok, QWEN3, as_template, TOOLS, add_generation_prompt=True)
    assert "<tool_response>\n" + '{"forecast": "sunny"}' in text
    assert r.usage.prompt_tokens == len(tok.encode(text, add_special_tokens=False))


def test_enable_thinking_reaches_the_template(client, tool_server):
    tok = tool_server.engine.tokenizer
    for kwargs in ({}, {"enable_thinking": False}):
        r = client.chat.completions.create(
            model="tiny", messages=ASK, max_tokens=1, extra_body={"chat_template_kwargs": kwargs}
        )
        text = render(tok, QWEN3, ASK, add_generation_prompt=True, **kwargs)
        assert text.endswith("</think>\n\n") == bool(kwargs)
        assert r.usage.prompt_tokens == len(tok.encode(text, add_special_tokens=False))


def test_auto_parses_calls_and_reasoning_from_the_output(client):
    """Whatever the model writes is parsed: here a choice constraint makes the tiny model write
    reasoning, a sentence and a call, streamed and not."""
    reply = (
        '<think>\nUse the tool.\n</think>\n\nChecking.\n<tool_call>\n{"name": "save_note", "arguments": '
        '{"text": "hi"}}\n</tool_call>'
    )
    kw = dict(model="tiny", messages=ASK, tools=TOOLS, max_tokens=200, temperature=0)
    kw["extra_body"] = {"structured_outputs": {"choice": [reply]}}
    msg = client.chat.completions.create(**kw).choices[0]
    assert msg.finish_reason == "tool_calls"
    assert msg.message.content == "Checking." and msg.message.reasoning_content == "Use the tool."
    assert check_calls(msg.message.tool_calls) == [("save_note", {"text": "hi"})]
    chunks = list(client.chat.completions.create(stream=True, **kw))
    content, calls, finish = reassemble(chunks)
    reasoning = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices)
    assert (content, reasoning, finish) == ("Checking.", "Use the tool.", "tool_calls")
    assert [(n, json.loads(a)) for _, n, a in calls] == [("save_note", {"text": "hi"})]


def test_strict_functions_in_auto_mode(client):
    """strict: true under tool_choice auto: the model may answer in text, but a call it starts
    must follow the schema (a grammar of text-or-calls); tool markup never leaks into content."""
    strict = [{**t, "function": {**t["function"], "strict": True}} for t in TOOLS]
    for seed in range(3):
        r = client.chat.completions.create(
            model="tiny",
            messages=ASK,
            tools=strict,
            max_tokens=60,
            temperature=1.0,
            seed=seed,
            extra_body=NO_THINKING,
        )
        choice = r.choices[0]
        assert "<tool_call>" not in (choice.message.content or "")
        if choice.finish_reason == "tool_calls":
            check_calls(choice.message.tool_calls)


STRICT = [{"type": "function", "function": {**TOOLS[0]["function"], "strict": True}}]


@pytest.mark.parametrize(
    "body, param",
    [
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools.0.function.name"),
        ({"tools": TOOLS + TOOLS[:1]}, "tools"),
        ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
        ({"tools": STRICT, "response_format": {"type": "json_object"}}, "tools"),
        (
            {
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}],
                "tool_choice": "required",
            },
            "tools",
        ),
        (
            {
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {"$defs": 3}}}],
                "tool_choice": "required",
            },
            "tools",
        ),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages.0"),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": "{"}}],
                    }
                ]
            },
            "messages.0.tool_calls.0.function.arguments",
        ),
    ],
)
def test_bad_tool_requests_are_400_naming_the_field(tool_server, body, param):
    payload = {"model": "tiny", "messages": ASK, "max_tokens": 4, **body}
    r = httpx.post(f"{tool_server.base_url}/v1/chat/completions", json=payload, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text
