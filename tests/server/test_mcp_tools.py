"""--mcp-config end to end: a real server on 127.0.0.1 with a tiny random model and the test's own
stdio MCP server (mcp_test_server.py). A forced call of an MCP tool is run by the server, its
result is fed back to the model, and the answer carries it; the openai SDK is the client."""

from __future__ import annotations

import json
import sys

import openai
import pytest

from lantern.server.app import ServerSettings
from tests.fixtures.tool_templates import QWEN3
from tests.server.conftest import start_server
from tests.server.test_mcp_bridge import TEST_SERVER

NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def mcp_server(tmp_path_factory, backend):
    from tests.fixtures.tiny_models import build_model

    folder = tmp_path_factory.mktemp("mcp")
    model = str(build_model("llama2", folder / "model", max_position_embeddings=4096))
    config = folder / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"test": {"command": sys.executable, "args": [TEST_SERVER]}}}))
    settings = ServerSettings(served_model_name="tiny", mcp_config=str(config), mcp_max_rounds=2)
    threads = {"num_threads": 1} if backend == "torch" else {}
    srv = start_server(model, settings, backend=backend, chat_template=QWEN3, **threads)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(mcp_server):
    return openai.OpenAI(base_url=f"{mcp_server.base_url}/v1", api_key="unused", max_retries=0)


def test_a_forced_mcp_call_is_run_and_its_result_is_in_the_answer(client):
    r = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "What is the secret word?"}],
        tool_choice={"type": "function", "function": {"name": "secret_word"}},
        max_tokens=96,
        temperature=0,
        extra_body=NO_THINKING,
    )
    message = r.choices[0].message.model_dump()
    calls = message["mcp_calls"]
    assert calls[0]["name"] == "secret_word"
    assert calls[0]["result"] == "periwinkle-42" and calls[0]["is_error"] is False
    # Two rounds at least: the forced call, then the model's reply with the result in its prompt.
    assert r.usage.prompt_tokens > 2 * 100


def test_arguments_reach_the_tool(client):
    r = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Add two numbers."}],
        tool_choice={"type": "function", "function": {"name": "add"}},
        max_tokens=128,
        temperature=0,
        extra_body=NO_THINKING,
    )
    call = r.choices[0].message.model_dump()["mcp_calls"][0]
    assert call["name"] == "add" and isinstance(call["arguments"]["a"], int)
    assert call["result"] == f"the sum is {call['arguments']['a'] + call['arguments']['b']}"


def test_streamed_answer_carries_the_calls(client):
    chunks = list(
        client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "What is the secret word?"}],
            tool_choice={"type": "function", "function": {"name": "secret_word"}},
            max_tokens=96,
            temperature=0,
            stream=True,
            extra_body=NO_THINKING,
        )
    )
    deltas = [c.choices[0].delta.model_dump() for c in chunks if c.choices]
    ran = [call for d in deltas for call in d.get("mcp_calls") or []]
    assert ran and ran[0]["result"] == "periwinkle-42"
    assert chunks[-1].choices[0].finish_reason is not None


def test_n_above_one_is_refused_naming_n(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], n=2, max_tokens=4, extra_body=NO_THINKING
        )
    assert err.value.body["param"] == "n"


def test_tool_choice_none_bypasses_the_mcp_tools(client):
    r = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        tool_choice="none",
        max_tokens=4,
        extra_body=NO_THINKING,
    )
    assert "mcp_calls" not in r.choices[0].message.model_dump()
