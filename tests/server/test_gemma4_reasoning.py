"""Gemma 4's thought channel (`<|channel>thought\n…<channel|>`) through a real server and the official
openai client, on both backends: the tiny llama with Gemma's channel markers as special tokens (as Gemma
4's tokenizer has them), served with a Gemma-4-shaped template. Thinking off, the generation prompt closes
an empty channel and the reply is all answer; a reply that thinks in the channel comes back split into
reasoning_content and content, streamed and whole alike; a thinking_token_budget counts inside the channel
the model opened and forces `<channel|>`, after which a forced call follows in Gemma's notation."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from lantern.app.engine.reasoning import GEMMA4
from tests.fixtures.tool_templates import GEMMA4 as GEMMA4_TEMPLATE
from tests.server.conftest import start_server
from tests.server.test_thinking_budget import llama_with_special_tokens
from tests.server.test_tool_calls import ASK, SCHEMAS, TOOLS, calls_of

THINKING = {"chat_template_kwargs": {"enable_thinking": True}}


@pytest.fixture(scope="module")
def channel_model(tmp_path_factory) -> str:
    return llama_with_special_tokens(tmp_path_factory, list(GEMMA4.markers), positions=4096)


@pytest.fixture(scope="module")
def srv(channel_model, backend):
    threads = {"num_threads": 1} if backend == "torch" else {}
    s = start_server(channel_model, backend=backend, chat_template=GEMMA4_TEMPLATE, **threads)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="unused", max_retries=0)


def test_thinking_off_is_all_answer(client):
    """The prompt ends in `<channel|>`: a reader taking that for an open channel would put the whole
    reply into reasoning_content."""
    got = client.chat.completions.create(model="tiny", messages=ASK, max_tokens=12, temperature=0).choices[0]
    assert got.message.content and got.finish_reason == "length"
    assert getattr(got.message, "reasoning_content", None) is None


def thought_of(tokens: list[str], budget: int) -> tuple[int, str]:
    """(index of the first token after the channel's label, the thought text) of an output that opened
    the channel and whose budget closed it: `<channel|>` is the budget's token, right after `budget`."""
    assert tokens[0] == GEMMA4.opener
    label = next(k for k in range(1, len(tokens)) if "".join(tokens[:k]).startswith(GEMMA4.start))
    assert tokens[label + budget] == GEMMA4.end and GEMMA4.end not in tokens[: label + budget]
    return label, "".join(tokens[: label + budget]).removeprefix(GEMMA4.start).strip()


def test_a_thought_comes_back_as_reasoning_streamed_and_whole(srv, client):
    """response_format shapes the answer after the channel (the model, biased, opens it; the grammar
    writes the label); the budget ends the thought; the JSON answer follows as content."""
    opener = srv.engine.tokenizer.convert_tokens_to_ids(GEMMA4.opener)
    fmt = {"type": "json_schema", "json_schema": {"name": "weather", "schema": SCHEMAS["get_weather"]}}
    kw = dict(model="tiny", messages=ASK, max_tokens=120, temperature=0, response_format=fmt)
    kw.update(logit_bias={str(opener): 100}, extra_body={**THINKING, "thinking_token_budget": 4})
    got = client.chat.completions.create(**kw, logprobs=True).choices[0]
    _, thought = thought_of([t.token for t in got.logprobs.content], 4)
    assert thought and got.message.reasoning_content == thought
    jsonschema.validate(json.loads(got.message.content), SCHEMAS["get_weather"])
    chunks = [c.choices[0].delta for c in client.chat.completions.create(**kw, stream=True) if c.choices]
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in chunks) == thought
    assert "".join(d.content or "" for d in chunks) == got.message.content


@pytest.mark.parametrize("budget", [0, 5])
def test_the_budget_closes_the_channel_then_the_forced_call_follows(srv, client, budget):
    """The model is biased to open the channel; the forcing grammar then writes its label, "thought".
    The budget counts from there: after `budget` tokens `<channel|>` is forced, and the call follows."""
    opener = srv.engine.tokenizer.convert_tokens_to_ids(GEMMA4.opener)
    got = client.chat.completions.create(
        model="tiny",
        messages=ASK,
        tools=TOOLS[:1],  # get_weather: enum and small integer range, so the forced call ends by the grammar
        tool_choice="required",
        max_tokens=300,
        temperature=0,
        logprobs=True,
        logit_bias={str(opener): 100},
        extra_body={**THINKING, "thinking_token_budget": budget},
    ).choices[0]
    _, thought = thought_of([t.token for t in got.logprobs.content], budget)
    assert got.finish_reason == "tool_calls" and calls_of(got.message)
    assert not got.message.content and (got.message.reasoning_content or "") == thought


def test_a_budget_in_another_markup_than_the_engine_counts_is_refused(channel_model):
    """--reasoning-parser gemma4 over a template without the channel: the split follows the flag, but the
    engine counts the template's markup (<think>), so a budget could not be enforced: a 400 naming it."""
    import httpx

    from lantern.server.app import ServerSettings
    from tests.fixtures.tool_templates import QWEN3

    settings = ServerSettings(served_model_name="tiny", reasoning_parser="gemma4")
    srv = start_server(channel_model, settings, backend="torch", chat_template=QWEN3, num_threads=1)
    try:
        body = {"model": "tiny", "messages": ASK, "max_tokens": 4, "thinking_token_budget": 3}
        r = httpx.post(f"{srv.base_url}/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "thinking_token_budget", r.text
        del body["thinking_token_budget"]
        assert httpx.post(f"{srv.base_url}/v1/chat/completions", json=body, timeout=60).status_code == 200
    finally:
        srv.stop()
