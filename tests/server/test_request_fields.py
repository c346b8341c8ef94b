"""OpenAI's documented request fields, audited against the official SDK's request types: each is
honoured, accepted as having no effect on the answer, or refused with a 400 naming it
(server/request_fields.py says which and why). Through a real server and the official openai
client on both backends; `reasoning_effort` on a tiny gpt-oss whose harmony template reads it."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from openai.types import completion_create_params as completion_params
from openai.types.chat import completion_create_params as chat_params
from pydantic import ValidationError

from lantern.app.engine import InvalidRequestError
from lantern.server.protocol import ChatCompletionRequest, CompletionRequest
from lantern.server.request_fields import EFFORTS, effort_template_kwargs
from lantern.server.responses_protocol import ResponsesRequest
from tests.fixtures.harmony_template import HARMONY, build_harmony_model
from tests.fixtures.tool_templates import QWEN3, render
from tests.server.conftest import start_server

HI = [{"role": "user", "content": "Hi"}]
# Our harmony template with gpt-oss's `Reasoning: {{ reasoning_effort }}` line (default medium).
EFFORT_TEMPLATE = HARMONY.replace("Reasoning: medium", "Reasoning: ' + (reasoning_effort | default('medium')) + '")
assert EFFORT_TEMPLATE != HARMONY

REFUSED = [
    ({"modalities": ["text", "audio"]}, "modalities"),
    ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ({"web_search_options": {}}, "web_search_options"),
    ({"verbosity": "low"}, "verbosity"),
    ({"moderation": {"model": "omni-moderation-latest"}}, "moderation"),
    ({"service_tier": "flex"}, "service_tier"),
    ({"service_tier": "priority"}, "service_tier"),
    ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
    ({"metadata": {"k": "v" * 513}}, "metadata"),
    ({"metadata": {"k" * 65: "v"}}, "metadata"),
    ({"prediction": {"type": "other", "content": "x"}}, "prediction"),
    ({"prediction": {"type": "content", "content": [{"type": "image"}]}}, "prediction.content"),
]
HARMLESS: dict[str, Any] = {
    "user": "u-1",
    "safety_identifier": "hash-of-user",
    "prompt_cache_key": "session-7",
    "prompt_cache_retention": "24h",
    "prompt_cache_options": {"mode": "implicit", "ttl": "30m"},
    "metadata": {"team": "lantern"},
    "store": True,
    "prediction": {"type": "content", "content": "Hello there"},
    "modalities": ["text"],
    "service_tier": "auto",
}


def chat_request(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "tiny", "messages": HI, **fields})


# -- the audit: no documented field is dropped by extra="ignore" ----------------------------------


def test_every_sdk_chat_field_is_a_known_field():
    unknown = set(chat_params.CompletionCreateParamsBase.__annotations__) - set(ChatCompletionRequest.model_fields)
    assert not unknown, f"fields the SDK sends that the server would silently ignore: {sorted(unknown)}"


def test_every_sdk_stream_option_is_a_known_field():
    from openai.types.chat.chat_completion_stream_options_param import ChatCompletionStreamOptionsParam

    from lantern.server.protocol import StreamOptions

    assert set(ChatCompletionStreamOptionsParam.__annotations__) <= set(StreamOptions.model_fields)
    with pytest.raises(ValidationError):
        StreamOptions(include_obfuscation="sometimes")


def test_every_sdk_completions_field_is_a_known_field():
    unknown = set(completion_params.CompletionCreateParamsBase.__annotations__) - set(CompletionRequest.model_fields)
    assert not unknown, f"fields the SDK sends that the server would silently ignore: {sorted(unknown)}"


def test_effort_values_are_the_sdks():
    from openai.types.shared.reasoning_effort import ReasoningEffort

    assert set(EFFORTS) == set(ReasoningEffort.__args__[0].__args__)  # Optional[Literal[...]]


# -- unit: refusals and the harmless fields --------------------------------------------------------


@pytest.mark.parametrize("fields,param", REFUSED, ids=[p for _, p in REFUSED])
def test_unhonourable_field_is_refused_naming_it(fields, param):
    with pytest.raises(InvalidRequestError) as info:
        chat_request(**fields).sampling_params()
    assert info.value.param == param and info.value.message.startswith(param)


def test_harmless_fields_are_accepted():
    assert chat_request(**HARMLESS).sampling_params() == chat_request().sampling_params()


def test_effort_outside_the_sdks_set_is_a_validation_error():
    with pytest.raises(ValidationError) as info:
        chat_request(reasoning_effort="extreme")
    assert info.value.errors()[0]["loc"] == ("reasoning_effort",)


def test_effort_reaches_the_template_under_the_name_it_reads():
    assert effort_template_kwargs(EFFORT_TEMPLATE, "high", None) == {"reasoning_effort": "high"}
    assert effort_template_kwargs(QWEN3, "none", {"x": 1}) == {"x": 1, "enable_thinking": False}
    assert effort_template_kwargs(QWEN3, "low", None) == {"enable_thinking": True}
    assert effort_template_kwargs(HARMONY, None, {"x": 1}) == {"x": 1}  # no effort: nothing added
    # The same value twice is one answer; a different one is a contradiction.
    assert effort_template_kwargs(EFFORT_TEMPLATE, "low", {"reasoning_effort": "low"}) == {"reasoning_effort": "low"}
    with pytest.raises(InvalidRequestError) as info:
        effort_template_kwargs(QWEN3, "high", {"enable_thinking": False})
    assert info.value.param == "reasoning_effort"


def test_effort_is_refused_where_the_template_reads_none():
    with pytest.raises(InvalidRequestError) as info:
        effort_template_kwargs(HARMONY, "high", None)  # "Reasoning: medium" is fixed text there
    assert info.value.param == "reasoning_effort"
    with pytest.raises(InvalidRequestError) as info:
        effort_template_kwargs(None, "low", None, param="reasoning.effort")
    assert info.value.param == "reasoning.effort"


def test_responses_effort_becomes_chats():
    body = ResponsesRequest.model_validate({"input": "Hi", "reasoning": {"effort": "max"}})
    assert body.to_chat([]).reasoning_effort == "max"
    with pytest.raises(InvalidRequestError) as info:
        ResponsesRequest.model_validate({"input": "Hi", "reasoning": {"effort": "huge"}}).to_chat([])
    assert info.value.param == "reasoning.effort"


# -- a real server, the official client, both backends --------------------------------------------


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


@pytest.mark.parametrize("fields,param", REFUSED[:6], ids=[p for _, p in REFUSED[:6]])
def test_sdk_sees_400_naming_the_field(client, fields, param):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=HI, max_tokens=2, **fields)
    assert info.value.status_code == 400 and info.value.param == param, info.value.body


def test_effort_on_a_template_that_reads_none_is_400(client):
    """The tiny llama's ChatML template has no reasoning switch: the effort would change nothing."""
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=HI, max_tokens=2, reasoning_effort="high")
    assert info.value.param == "reasoning_effort", info.value.body
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="tiny", input="Hi", max_output_tokens=2, reasoning={"effort": "low"})
    assert info.value.param == "reasoning.effort", info.value.body


def test_harmless_fields_leave_the_answer_unchanged(client):
    plain = client.chat.completions.create(model="tiny", messages=HI, max_tokens=8, temperature=0)
    tagged = client.chat.completions.create(model="tiny", messages=HI, max_tokens=8, temperature=0, **HARMLESS)
    assert tagged.choices[0].message.content == plain.choices[0].message.content
    assert tagged.usage.prompt_tokens == plain.usage.prompt_tokens


@pytest.fixture(scope="module")
def effort_server(tmp_path_factory, backend):
    model = build_harmony_model(tmp_path_factory.mktemp("effort"))
    threads = {"num_threads": 1} if backend == "torch" else {}  # 2 shared cores: one thread is fastest
    srv = start_server(str(model), backend=backend, chat_template=EFFORT_TEMPLATE, **threads)
    yield srv
    srv.stop()


def test_reasoning_effort_reaches_the_template(effort_server):
    """Greedy chat with an effort scores its first tokens exactly as /v1/completions does on the
    prompt our own rendering with that effort makes (and the efforts' prompts differ)."""
    client = openai.OpenAI(base_url=f"{effort_server.base_url}/v1", api_key="unused", max_retries=0)
    tok = effort_server.engine.tokenizer
    prompts = {}
    for effort in ("low", "high"):
        text = render(tok, EFFORT_TEMPLATE, HI, add_generation_prompt=True, reasoning_effort=effort)
        assert f"Reasoning: {effort}" in text
        ids = prompts[effort] = list(tok.encode(text, add_special_tokens=False))
        chat = client.chat.completions.create(
            model="tiny", messages=HI, max_tokens=4, temperature=0, logprobs=True, reasoning_effort=effort
        )
        ref = client.completions.create(model="tiny", prompt=ids, max_tokens=4, temperature=0, logprobs=0)
        assert chat.usage.prompt_tokens == len(ids)
        got = [t.logprob for t in chat.choices[0].logprobs.content]
        assert got == pytest.approx(ref.choices[0].logprobs.token_logprobs, abs=1e-4)
        # /v1/responses' reasoning.effort renders the same prompt.
        r = client.responses.create(model="tiny", input="Hi", max_output_tokens=4, reasoning={"effort": effort})
        assert r.usage.input_tokens == len(ids)
    assert prompts["low"] != prompts["high"]
