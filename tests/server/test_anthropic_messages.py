"""Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) through a real server and the
official `anthropic` SDK, on both backends: a tiny random model with a Qwen3-style template
(hermes `<tool_call>` blocks, `<think>` reasoning). Replies are checked against what
/v1/chat/completions answers for the same conversation (greedy), prompts against transformers'
rendering of the same messages, tool inputs against their schema."""

from __future__ import annotations

import json

import anthropic
import httpx
import jsonschema
import pytest
from starlette.testclient import TestClient

from lantern.server.app import ServerSettings, create_app
from tests.fixtures.tool_templates import QWEN3, R1_STYLE, render
from tests.server.conftest import start_server

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS = [{"name": "get_weather", "description": "Weather", "input_schema": WEATHER}]
OPENAI_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER}}
]
ASK = [{"role": "user", "content": "What is the weather in Paris for three days?"}]
GREEDY = {"temperature": 0}
JSON_TYPE = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def long_context_model(tmp_path_factory) -> str:
    """The tiny llama with room for a tools system prompt (the tiny BPE spends ~900 tokens on it)."""
    from tests.fixtures.tiny_models import build_model

    return str(build_model("llama2", tmp_path_factory.mktemp("anthropic"), max_position_embeddings=4096))


def _threads(backend: str) -> dict:
    # One torch thread: on a shared 2-core box more threads make each step ~10x slower.
    return {"num_threads": 1} if backend == "torch" else {}


@pytest.fixture(scope="module")
def srv(long_context_model, backend):
    s = start_server(long_context_model, backend=backend, chat_template=QWEN3, **_threads(backend))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(srv):
    return anthropic.Anthropic(base_url=srv.base_url, api_key="unused", max_retries=0)


def chat(srv, messages, **kw) -> dict:
    r = httpx.post(
        f"{srv.base_url}/v1/chat/completions", json={"model": "tiny", "messages": messages, **kw}, timeout=120
    )
    assert r.status_code == 200, r.text
    return r.json()


NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


def test_create_matches_chat_completions(client, srv):
    msg = client.messages.create(
        model="tiny", max_tokens=12, system="Be brief.", messages=ASK, extra_body=GREEDY, metadata={"user_id": "u1"}
    )
    assert msg.type == "message" and msg.role == "assistant" and msg.id.startswith("msg_")
    assert [b.type for b in msg.content] == ["text"]
    want = chat(srv, [{"role": "system", "content": "Be brief."}, *ASK], max_tokens=12, **GREEDY, **NO_THINKING)
    assert msg.content[0].text == want["choices"][0]["message"]["content"]
    assert msg.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[want["choices"][0]["finish_reason"]]
    assert msg.usage.output_tokens == want["usage"]["completion_tokens"]
    u = msg.usage
    assert u.input_tokens + u.cache_read_input_tokens == want["usage"]["prompt_tokens"]


def test_stream_events_and_final_message(client, srv):
    kw = dict(model="tiny", max_tokens=10, messages=ASK, extra_body=GREEDY)
    full = client.messages.create(**kw)
    with client.messages.stream(**kw) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == final.content[0].text == full.content[0].text
    assert final.stop_reason == full.stop_reason and final.usage.output_tokens == full.usage.output_tokens
    # The raw event order, as Anthropic sends it.
    with httpx.stream("POST", f"{srv.base_url}/v1/messages", json={**kw, "stream": True, **GREEDY}, timeout=120) as r:
        kinds = [line[7:] for line in r.iter_lines() if line.startswith("event: ")]
    assert kinds[0] == "message_start" and kinds[1] == "content_block_start"
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[2:-3]) == {"content_block_delta"}


def test_count_tokens_is_the_rendered_prompt(client, srv):
    tok = srv.engine.tokenizer
    system = [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Use tools."}]
    n = client.messages.count_tokens(model="tiny", system=system, messages=ASK, tools=TOOLS).input_tokens
    text = render(
        tok,
        QWEN3,
        [{"role": "system", "content": "Be brief.\n\nUse tools."}, *ASK],
        OPENAI_TOOLS,
        add_generation_prompt=True,
        enable_thinking=False,
    )
    assert n == len(tok.encode(text, add_special_tokens=False))
    thinking = {"type": "enabled", "budget_tokens": 2048}
    n_thinking = client.messages.count_tokens(model="tiny", messages=ASK, thinking=thinking).input_tokens
    text = render(tok, QWEN3, ASK, add_generation_prompt=True)  # thinking on: the block is left to the model
    assert n_thinking == len(tok.encode(text, add_special_tokens=False))


def test_tool_choice_any_gives_a_valid_tool_use(client):
    # One call (greedy decoding of a random model would otherwise repeat calls up to max_tokens).
    choice = {"type": "any", "disable_parallel_tool_use": True}
    kw = dict(model="tiny", max_tokens=120, messages=ASK, tools=TOOLS, tool_choice=choice, extra_body=GREEDY)
    msg = client.messages.create(**kw)
    assert msg.stop_reason == "tool_use"
    uses = [b for b in msg.content if b.type == "tool_use"]
    assert uses and uses[0].name == "get_weather" and uses[0].id.startswith("call_")
    for b in uses:
        jsonschema.validate(b.input, WEATHER)
    with client.messages.stream(**kw) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    assert [(b.name, b.input) for b in final.content if b.type == "tool_use"] == [(b.name, b.input) for b in uses]


def test_named_tool_and_sampled_calls_validate(client):
    for seed in range(2):
        msg = client.messages.create(
            model="tiny",
            max_tokens=120,
            messages=ASK,
            tools=TOOLS,
            tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
            extra_body={"temperature": 1.0, "seed": seed},
        )
        uses = [b for b in msg.content if b.type == "tool_use"]
        assert msg.stop_reason == "tool_use" and len(uses) == 1
        jsonschema.validate(uses[0].input, WEATHER)


def test_output_config_json_schema(client):
    """output_config.format: the reply is JSON that follows the schema (the response_format path)."""
    fmt = {"type": "json_schema", "schema": WEATHER}
    for seed in range(2):
        msg = client.messages.create(
            model="tiny",
            max_tokens=80,
            messages=ASK,
            output_config={"format": fmt},
            extra_body={"temperature": 1.0, "seed": seed},
        )
        assert msg.stop_reason == "end_turn", msg
        jsonschema.validate(json.loads(msg.content[0].text), WEATHER)


def test_tool_result_turn_renders_like_the_template(client, srv):
    history = [
        *ASK,
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris", "days": 3}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]},
                {"type": "text", "text": "And tomorrow?"},
            ],
        },
    ]
    msg = client.messages.create(model="tiny", max_tokens=2, messages=history, tools=TOOLS, extra_body=GREEDY)
    as_openai = [
        *ASK,
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 3}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
        {"role": "user", "content": "And tomorrow?"},
    ]
    tok = srv.engine.tokenizer
    text = render(tok, QWEN3, as_openai, OPENAI_TOOLS, add_generation_prompt=True, enable_thinking=False)
    assert "<tool_response>\nsunny\n</tool_response>" in text
    want = len(tok.encode(text, add_special_tokens=False))
    assert msg.usage.input_tokens + msg.usage.cache_read_input_tokens == want
    assert client.messages.count_tokens(model="tiny", messages=history, tools=TOOLS).input_tokens == want
    # is_error: chat templates have no flag for it, so the result says so in its text.
    history[2]["content"][0]["is_error"] = True
    as_openai[2]["content"] = "Error: sunny"
    text = render(tok, QWEN3, as_openai, OPENAI_TOOLS, add_generation_prompt=True, enable_thinking=False)
    n = client.messages.count_tokens(model="tiny", messages=history, tools=TOOLS).input_tokens
    assert n == len(tok.encode(text, add_special_tokens=False))


def test_stop_sequences(client):
    kw = dict(model="tiny", max_tokens=24, messages=ASK, extra_body=GREEDY)
    text = client.messages.create(**kw).content[0].text
    assert len(text) >= 12, text
    stop = text[6:9]
    msg = client.messages.create(stop_sequences=[stop], **kw)
    assert (msg.stop_reason, msg.stop_sequence) == ("stop_sequence", stop)
    assert msg.content[0].text == text[: text.index(stop)]
    with client.messages.stream(stop_sequences=[stop], **kw) as stream:
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence, final.content[0].text) == (
        "stop_sequence",
        stop,
        text[: text.index(stop)],
    )


def test_prefill_continues_the_reply(client, srv):
    tok = srv.engine.tokenizer
    history = [*ASK, {"role": "assistant", "content": "The weather"}]
    n = client.messages.count_tokens(model="tiny", messages=history).input_tokens
    prompt = render(tok, QWEN3, ASK, add_generation_prompt=True, enable_thinking=False)
    assert n == len(tok.encode(prompt, add_special_tokens=False)) + len(
        tok.encode("The weather", add_special_tokens=False)
    )


@pytest.fixture(scope="module")
def r1_srv(long_context_model, backend):
    """A template whose generation prompt opens `<think>` (DeepSeek-R1 distills): the reply starts
    inside the reasoning block."""
    s = start_server(long_context_model, backend=backend, chat_template=R1_STYLE, **_threads(backend))
    yield s
    s.stop()


def test_thinking_blocks(r1_srv):
    """thinking enabled: the reasoning /v1/chat/completions returns as reasoning_content comes as a
    thinking block (streamed as thinking_delta); not enabled: no thinking block."""
    c = anthropic.Anthropic(base_url=r1_srv.base_url, api_key="unused", max_retries=0)
    reasoning = chat(r1_srv, ASK, max_tokens=16, **GREEDY)["choices"][0]["message"]["reasoning_content"]
    stop = next(reasoning[i : i + 3] for i in range(4, len(reasoning) - 3) if reasoning[i : i + 3].strip())
    want = reasoning[: reasoning.index(stop)].rstrip()
    # budget_tokens must stay below max_tokens (Anthropic's rule): a large max_tokens, cut by a stop sequence.
    kw = dict(
        model="tiny",
        max_tokens=1025,
        messages=ASK,
        thinking={"type": "enabled", "budget_tokens": 1024},
        stop_sequences=[stop],
        extra_body=GREEDY,
    )
    msg = c.messages.create(**kw)
    assert [b.type for b in msg.content] == ["thinking"] and msg.content[0].thinking == want
    assert msg.stop_reason == "stop_sequence"
    with c.messages.stream(**kw) as stream:
        deltas = [e.delta.thinking for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()
    assert "".join(deltas) == final.content[0].thinking == want
    plain = c.messages.create(model="tiny", max_tokens=8, messages=ASK, extra_body=GREEDY)
    assert [b.type for b in plain.content] == ["text"] and plain.content[0].text == ""


def test_x_api_key_is_accepted(srv):
    app = create_app(srv.engine, ServerSettings(served_model_name="tiny", api_keys=["sk-test"]))
    with TestClient(app) as http:
        good = anthropic.Anthropic(base_url="http://testserver", api_key="sk-test", http_client=http, max_retries=0)
        assert good.messages.count_tokens(model="tiny", messages=ASK).input_tokens > 0
        bad = anthropic.Anthropic(base_url="http://testserver", api_key="wrong", http_client=http, max_retries=0)
        with pytest.raises(anthropic.AuthenticationError) as exc:
            bad.messages.count_tokens(model="tiny", messages=ASK)
        assert exc.value.body == {
            "type": "error",
            "error": {"type": "authentication_error", "message": "missing or invalid API key (send x-api-key: KEY)"},
        }
        bearer = http.post(
            "/v1/messages/count_tokens", json={"messages": ASK}, headers={"Authorization": "Bearer sk-test"}
        )
        assert bearer.status_code == 200 and bearer.json()["input_tokens"] > 0


@pytest.mark.parametrize(
    "body, param",
    [
        ({"max_tokens": None}, "max_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": 1.5}, "temperature"),
        ({"top_k": 0}, "top_k"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "system", "content": "x"}]}, "messages.0.role"),
        ({"messages": [{"role": "user", "content": [{"type": "video"}]}]}, "messages.0.content.0"),
        ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages.0.content.0.text"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "x"}}]}]},
            "messages.0.content.0",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image", "source": {}}]}
                        ],
                    }
                ]
            },
            "messages.0.content.0.content.0",
        ),
        (
            {"messages": [{"role": "assistant", "content": [{"type": "redacted_thinking", "data": "x"}]}]},
            "messages.0.content.0",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]},
            "messages.0.content.0",
        ),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools.0.type"),
        ({"tools": [{"name": "f"}]}, "tools.0.input_schema"),
        ({"tools": [{"name": "bad name", "input_schema": {}}]}, "tools.0.name"),
        ({"tools": TOOLS, "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": {"type": "tool"}}, "tool_choice"),
        ({"tool_choice": {"type": "any"}}, "tool_choice"),
        ({"thinking": {"type": "enabled"}}, "thinking"),
        ({"thinking": {"type": "enabled", "budget_tokens": 100}}, "thinking.budget_tokens"),
        ({"thinking": {"type": "enabled", "budget_tokens": 2048}}, "thinking.budget_tokens"),
        ({"stop_sequences": "x"}, "stop_sequences"),
        ({"mcp_servers": [{"url": "x"}]}, "mcp_servers"),
        ({"output_config": {"effort": "high"}}, "output_config.effort"),
        ({"output_format": {"type": "json_schema", "schema": {"type": "object"}}}, "output_format"),
        ({"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}}, "context_management"),
        ({"messages": [*ASK, {"role": "assistant", "content": "ends with a space "}]}, "messages"),
    ],
)
def test_bad_input_is_400_in_anthropic_shape(srv, body, param):
    payload = {"model": "tiny", "max_tokens": 8, "messages": ASK, **body}
    payload = {k: v for k, v in payload.items() if v is not None}
    r = httpx.post(f"{srv.base_url}/v1/messages", json=payload, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error", err
    assert err["error"]["message"].startswith(param + ":") or err["error"]["message"].startswith(param + " "), err


def test_errors_through_the_sdk(client, srv):
    with pytest.raises(anthropic.BadRequestError) as exc:
        client.messages.create(model="tiny", max_tokens=8, messages=[{"role": "user", "content": "x" * 40000}])
    assert exc.value.body["error"]["type"] == "invalid_request_error"
    assert exc.value.body["error"]["message"].startswith("messages")
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="claude-nope", max_tokens=8, messages=ASK)
    r = httpx.post(f"{srv.base_url}/v1/messages", content=b"{not json", headers=JSON_TYPE, timeout=30)
    assert r.status_code == 400 and r.json() == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "request body is not valid JSON"},
    }


def test_routing_and_size_errors_in_anthropic_shape(srv):
    """Errors raised before the route runs (405, 413) and a message quoting a lone surrogate sent by
    the client (it cannot be encoded as UTF-8 as is) are answered in Anthropic's envelope, not a 500."""
    app = create_app(srv.engine, ServerSettings(served_model_name="tiny", max_request_bytes=2000))
    with TestClient(app) as http:
        r = http.get("/v1/messages")
        assert r.status_code == 405 and "POST" in r.headers["allow"]
        method = {"type": "invalid_request_error", "message": "Method Not Allowed"}
        assert r.json() == {"type": "error", "error": method}
        r = http.post("/v1/messages/count_tokens", json={"messages": [{"role": "user", "content": "x" * 4000}]})
        assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large", r.text
        body = '{"model": "\\ud800", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}'
        r = http.post("/v1/messages", content=body, headers=JSON_TYPE)
        assert r.status_code == 404, r.text
        assert r.json()["error"] == {
            "type": "not_found_error",
            "message": "model: The model `\\ud800` does not exist; this server serves `tiny`.",
        }
        r = http.post("/v1/messages", content=b"\x80", headers=JSON_TYPE)  # not UTF-8: FastAPI's own 400
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", r.text
        # The OpenAI routes keep OpenAI's envelope.
        r = http.get("/v1/chat/completions")
        assert r.status_code == 405 and set(r.json()["error"]) == {"message", "type", "param", "code"}
