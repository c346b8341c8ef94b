"""POST /v1/responses through a real server and the official openai client, on both backends: a
tiny random model with a Qwen3-style template (hermes `<tool_call>` blocks, `<think>` reasoning).
A response is the chat request it translates to, so the chat endpoint is the reference: the same
prompt (usage.input_tokens == prompt_tokens) and, greedy, the same text."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from lantern.server.protocol import ChatMessage
from lantern.server.response_store import ResponseStore
from tests.fixtures.tool_templates import QWEN3
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
TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather", "parameters": WEATHER}]
CHAT_TOOLS = [{"type": "function", "function": {k: v for k, v in TOOLS[0].items() if k != "type"}}]
ANSWER = {
    "type": "object",
    "properties": {"answer": {"type": "string", "maxLength": 8}, "n": {"type": "integer"}},
    "required": ["answer", "n"],
    "additionalProperties": False,
}
NO_THINKING = {"effort": "none"}  # -> enable_thinking false in the template


@pytest.fixture(scope="module")
def long_context_model(tmp_path_factory) -> str:
    from tests.fixtures.tiny_models import build_model

    return str(build_model("llama2", tmp_path_factory.mktemp("responses"), max_position_embeddings=4096))


@pytest.fixture(scope="module")
def resp_server(long_context_model, backend):
    threads = {"num_threads": 1} if backend == "torch" else {}  # 2 shared cores: one thread is fastest
    srv = start_server(long_context_model, backend=backend, chat_template=QWEN3, **threads)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(resp_server):
    return openai.OpenAI(base_url=f"{resp_server.base_url}/v1", api_key="unused", max_retries=0)


def test_create_matches_chat_and_streams_the_same_text(client):
    kw = dict(model="tiny", max_output_tokens=12, temperature=0)
    r = client.responses.create(input="Hello there", instructions="Be brief.", reasoning=NO_THINKING, **kw)
    chat = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}],
        max_tokens=12,
        temperature=0,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.output_text == chat.choices[0].message.content
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.usage.output_tokens == chat.usage.completion_tokens
    assert (r.status, r.incomplete_details.reason) == ("incomplete", "max_output_tokens")  # cut by the limit
    events = list(
        client.responses.create(input="Hello there", instructions="Be brief.", reasoning=NO_THINKING, stream=True, **kw)
    )
    assert [e.sequence_number for e in events] == list(range(len(events)))
    types = [e.type for e in events]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert types[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == r.output_text == events[-1].response.output_text
    assert events[-1].response.usage.input_tokens == r.usage.input_tokens


def test_json_schema_format_with_the_sdk_stream_helper(client):
    fmt = {"format": {"type": "json_schema", "name": "answer", "schema": ANSWER, "strict": True}}
    kw = dict(model="tiny", input="Answer in JSON.", max_output_tokens=120, temperature=0, text=fmt)
    with client.responses.stream(**kw) as stream:
        deltas = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert final.status == "completed" and final.output_text == deltas
    jsonschema.validate(json.loads(final.output_text), ANSWER)
    assert client.responses.create(**kw).output_text == final.output_text


def test_required_function_tool_makes_a_valid_call(client):
    kw = dict(
        model="tiny",
        input="Weather in Paris?",
        tools=TOOLS,
        tool_choice="required",
        temperature=0,
        parallel_tool_calls=False,
        max_output_tokens=80,
        reasoning=NO_THINKING,
    )
    r = client.responses.create(**kw)
    calls = [item for item in r.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].call_id.startswith("call_")
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER)
    with client.responses.stream(**kw) as stream:
        events = list(stream)
        final = stream.get_final_response()
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    streamed = [item for item in final.output if item.type == "function_call"]
    assert len(done) == 1 and done[0].arguments == args == streamed[0].arguments == calls[0].arguments


def test_previous_response_id_continues_the_conversation(client):
    first = client.responses.create(
        model="tiny", input="My name is Ana.", max_output_tokens=6, temperature=0, reasoning=NO_THINKING
    )
    second = client.responses.create(
        model="tiny",
        previous_response_id=first.id,
        input="What is my name?",
        max_output_tokens=4,
        temperature=0,
        reasoning=NO_THINKING,
    )
    history = [
        {"role": "user", "content": "My name is Ana."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "What is my name?"},
    ]
    chat = client.chat.completions.create(
        model="tiny", messages=history, max_tokens=1, extra_body={"chat_template_kwargs": {"enable_thinking": False}}
    )
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens == chat.usage.prompt_tokens > first.usage.input_tokens
    assert second.usage.input_tokens_details.cached_tokens > 0  # the first turn's blocks were reused


def test_function_call_output_turn(client):
    """A call and its output as input items (and via previous_response_id): the prompt is what
    the chat endpoint renders from the same assistant tool_calls and tool messages."""
    call = {
        "type": "function_call",
        "call_id": "call_1",
        "name": "get_weather",
        "arguments": '{"city": "Oslo", "days": 2}',
    }
    items = [
        {"role": "user", "content": "Weather in Oslo?"},
        call,
        {"type": "function_call_output", "call_id": "call_1", "output": '{"sky": "clear"}'},
    ]
    r = client.responses.create(model="tiny", input=items, tools=TOOLS, max_output_tokens=2, temperature=0)
    messages = [
        items[0],
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": call["arguments"]},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "clear"}'},
    ]
    chat = client.chat.completions.create(model="tiny", messages=messages, tools=CHAT_TOOLS, max_tokens=1)
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    first = client.responses.create(
        model="tiny",
        input="Weather in Oslo?",
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=80,
        temperature=0,
        reasoning=NO_THINKING,
    )
    made = next(item for item in first.output if item.type == "function_call")
    out = {"type": "function_call_output", "call_id": made.call_id, "output": "clear"}
    then = client.responses.create(
        model="tiny", previous_response_id=first.id, input=[out], tools=TOOLS, max_output_tokens=2, temperature=0
    )
    assert then.usage.input_tokens > first.usage.input_tokens


def test_get_delete_and_store_false(client, resp_server):
    r = client.responses.create(model="tiny", input="Hi", max_output_tokens=3, temperature=0, metadata={"k": "v"})
    got = client.responses.retrieve(r.id)
    assert got.output_text == r.output_text and got.metadata == {"k": "v"}
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="tiny", previous_response_id=r.id, input="again", max_output_tokens=2)
    assert err.value.body["param"] == "previous_response_id"
    unstored = client.responses.create(model="tiny", input="Hi", max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


@pytest.mark.parametrize(
    "body, param",
    [
        ({"tools": [{"type": "web_search"}]}, "tools.0.type"),
        ({"tools": [{"type": "function", "name": "bad name!"}]}, "tools.0.name"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input.0.content.0"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input.0.type"),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{"}]}, "input.0.arguments"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input.0.call_id"),
        ({"input": []}, "input"),
        ({"previous_response_id": "resp_unknown"}, "previous_response_id"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"temperature": -1}, "temperature"),
        ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nonsense"}}}}, "text.format"),
        ({"text": {"verbosity": "low"}}, "text.verbosity"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"include": ["reasoning.encrypted_content"]}, "include"),
        ({"background": True}, "background"),
        ({"truncation": "auto"}, "truncation"),
        ({"reasoning": {"summary": "detailed"}}, "reasoning.summary"),
        ({"model": "other"}, "model"),
    ],
)
def test_bad_input_is_400_naming_the_field(resp_server, body, param):
    payload = {"model": "tiny", "input": "Hi", "max_output_tokens": 4, **body}
    r = httpx.post(f"{resp_server.base_url}/v1/responses", json=payload, timeout=60)
    assert r.status_code == (404 if param == "model" else 400), r.text
    assert r.json()["error"]["param"] == param, r.text


def test_store_bounds_and_tenants():
    """The store's bound (LRU entries, idle TTL) and tenant isolation, without a server."""
    now = [0.0]
    store = ResponseStore(max_entries=2, ttl_s=60, clock=lambda: now[0])
    msg = [ChatMessage(role="user", content="x")]
    for rid in ("a", "b"):
        store.put(rid, "t1", {"id": rid}, msg)
    assert store.get("a", "t1") is not None and store.get("a", "t2") is None  # another key's id is unknown
    store.put("c", "t1", {"id": "c"}, msg)  # evicts b, the least recently used
    assert store.get("b", "t1") is None and store.get("a", "t1") is not None and len(store) == 2
    assert not store.delete("a", "t2") and store.delete("a", "t1")
    now[0] = 61.0
    assert store.get("c", "t1") is None and len(store) == 0


def test_output_items_events_are_what_the_sdk_parses():
    """Reasoning, text and a call streamed in pieces: every event validates as the SDK's own
    event type, the SDK's stream accumulator takes them, and the items hold the whole pieces."""
    from openai.lib.streaming.responses._responses import ResponseStreamState
    from openai.types.responses import Response, ResponseStreamEvent
    from pydantic import TypeAdapter

    from lantern.server.routes.responses import OutputItems
    from lantern.server.tool_parsers.base import CallDelta
    from lantern.server.tool_parsers.request import ChoiceDelta

    items = OutputItems(obfuscate=True)
    events = items.feed(ChoiceDelta(reasoning="Use "))
    events += items.feed(ChoiceDelta(reasoning="the tool.", content="Checking."))
    events += items.feed(ChoiceDelta(calls=[CallDelta(0, "call_1", "get_weather", '{"city": ')]))
    events += items.feed(ChoiceDelta(calls=[CallDelta(0, arguments='"Oslo", "days": 2}')]))
    events += items.finish("completed")
    base = {"id": "resp_1", "object": "response", "created_at": 0, "model": "tiny", "parallel_tool_calls": True,
            "tool_choice": "auto", "tools": []}  # fmt: skip
    created = {"type": "response.created", "response": {**base, "status": "in_progress", "output": []}}
    completed = {"type": "response.completed", "response": {**base, "status": "completed", "output": items.items}}
    adapter = TypeAdapter(ResponseStreamEvent)
    state = ResponseStreamState(input_tools=[], text_format=openai.omit)
    for seq, event in enumerate([created, *events, completed]):
        parsed = adapter.validate_python({**event, "sequence_number": seq})
        assert parsed.type == event["type"]
        state.handle_event(parsed)
    kinds = [i["type"] for i in items.items]
    assert kinds == ["reasoning", "message", "function_call"]
    assert items.items[0]["content"][0]["text"] == "Use the tool."
    final = Response.model_validate(completed["response"])
    assert final.output_text == "Checking." and final.output[2].arguments == '{"city": "Oslo", "days": 2}'
    assert all(i["status"] == "completed" for i in items.items)
    assert all("obfuscation" in e for e in events if e["type"].endswith(".delta"))


def test_reasoning_and_assistant_items_render_as_one_turn(client):
    """A reasoning item and an assistant message (output_text) are one assistant turn with
    reasoning_content, as the chat endpoint renders it."""
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Greet back."}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello!"}]},
        {"role": "user", "content": "And now?"},
    ]
    r = client.responses.create(model="tiny", input=items, max_output_tokens=1, temperature=0)
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!", "reasoning_content": "Greet back."},
        {"role": "user", "content": "And now?"},
    ]
    chat = client.chat.completions.create(model="tiny", messages=messages, max_tokens=1)
    assert r.usage.input_tokens == chat.usage.prompt_tokens
