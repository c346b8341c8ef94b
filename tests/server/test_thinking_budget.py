"""thinking_token_budget through a real server on both backends (torch and MLX), with the official
openai and anthropic SDKs: after N reasoning tokens the engine forces `</think>` and the model
answers. The tiny random llama's tokenizer has `<think>`/`</think>` as special tokens (as Qwen3's
and R1's have), and its template opens the block in the generation prompt (Qwen3-thinking-2507
style), so everything it writes is reasoning until `</think>`: a random model never writes that
token itself (checked each time), so every `</think>` seen here is the budget's. Token positions
are read off logprobs (one entry per generated token); greedy decoding makes the reasoning equal
to the unbudgeted reply's first N tokens."""

from __future__ import annotations

import json

import anthropic
import httpx
import jsonschema
import openai
import pytest

from lantern.app.engine.reasoning import THINK_END, THINK_START
from tests.fixtures.tiny_models import build_model, build_tokenizer
from tests.fixtures.tool_templates import QWEN3
from tests.server.conftest import start_server

# Qwen3-thinking-2507: the generation prompt ends inside an open block.
GEN_PROMPT = "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
OPEN_THINKING = QWEN3.replace(GEN_PROMPT, GEN_PROMPT[:-4] + "<think>\\n' }}")
assert OPEN_THINKING != QWEN3
ASK = [{"role": "user", "content": "What is the weather in Paris for three days?"}]
GREEDY = {"temperature": 0}
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}, "days": {"type": "integer"}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER}}]


def llama_with_special_tokens(tmp_path_factory, tokens: list[str], positions: int = 2048) -> str:
    """The tiny llama plus `tokens` as special tokens, with rows in the model (the last ids)."""
    from tokenizers import AddedToken
    from transformers import AutoTokenizer

    base = len(build_tokenizer(tmp_path_factory.mktemp("special-tok")))
    out = tmp_path_factory.mktemp("special")
    build_model("llama2", out, vocab_size=base + len(tokens), max_position_embeddings=positions)
    tok = AutoTokenizer.from_pretrained(str(out))
    tok.add_tokens([AddedToken(t, special=True) for t in tokens], special_tokens=True)
    assert tok.convert_tokens_to_ids(tokens) == list(range(base, base + len(tokens)))
    tok.save_pretrained(str(out))
    return str(out)


@pytest.fixture(scope="module")
def think_model(tmp_path_factory) -> str:
    """The tiny llama plus two special tokens, `<think>` and `</think>`, with rows in the model."""
    return llama_with_special_tokens(tmp_path_factory, [THINK_START, THINK_END])


@pytest.fixture(scope="module")
def srv(think_model, backend):
    threads = {"num_threads": 1} if backend == "torch" else {}  # one torch thread: the box has 2 cores
    s = start_server(think_model, backend=backend, chat_template=OPEN_THINKING, **threads)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="unused", max_retries=0)


def chat(client, budget: int | None = None, **kw):
    extra = {} if budget is None else {"thinking_token_budget": budget}
    kw = {"model": "tiny", "messages": ASK, "logprobs": True, **GREEDY, **kw}
    return client.chat.completions.create(**kw, extra_body=extra).choices[0]


def tokens(choice) -> list[str]:
    return [t.token for t in choice.logprobs.content]


@pytest.mark.parametrize("n", [1, 12])
def test_reasoning_is_exactly_n_tokens_then_the_answer(client, n):
    free = chat(client, max_tokens=n + 8)
    assert THINK_END not in tokens(free)  # the model would have gone on reasoning
    capped = chat(client, max_tokens=n).message.reasoning_content  # the first n tokens' reasoning
    got = chat(client, n, max_tokens=n + 9)
    t = tokens(got)
    assert t[:n] == tokens(free)[:n] and t[n] == THINK_END and len(t) == n + 9
    assert got.message.reasoning_content == capped
    assert got.message.content and "think>" not in got.message.content
    assert got.finish_reason == "length"
    stream = client.chat.completions.create(
        model="tiny", messages=ASK, max_tokens=n + 9, stream=True, extra_body={"thinking_token_budget": n}, **GREEDY
    )
    deltas = [c.choices[0].delta for c in stream if c.choices]
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == capped
    assert "".join(d.content or "" for d in deltas) == got.message.content


def test_budget_zero_closes_the_block_at_once(client):
    got = chat(client, 0, max_tokens=8)
    assert tokens(got)[0] == THINK_END and THINK_END not in tokens(got)[1:]
    assert not got.message.reasoning_content and got.message.content


def test_completions_count_from_the_models_own_opener(srv, client):
    """No block in the prompt: the output reasons only once the model opens one (biased to here),
    and the budget counts from there; an output that opens none is left as it was."""
    tok = srv.engine.tokenizer
    think = tok.convert_tokens_to_ids(THINK_START)

    def complete(**kw):
        return client.completions.create(model="tiny", prompt="Hello there", logprobs=0, **GREEDY, **kw).choices[0]

    biased = complete(max_tokens=10, logit_bias={str(think): 100}, extra_body={"thinking_token_budget": 3})
    assert biased.logprobs.tokens == [THINK_START] * 4 + [THINK_END] + [THINK_START] * 5
    free = complete(max_tokens=10)
    assert THINK_START not in free.logprobs.tokens
    assert complete(max_tokens=10, extra_body={"thinking_token_budget": 0}).logprobs.tokens == free.logprobs.tokens


def test_a_forced_tool_call_grammar_leaves_room_for_the_end_of_reasoning(client):
    got = chat(client, 6, max_tokens=400, tools=TOOLS, tool_choice="required")
    t = tokens(got)
    assert t[6] == THINK_END and THINK_END not in t[:6]
    assert got.finish_reason == "tool_calls" and len(got.message.tool_calls) >= 1
    for call in got.message.tool_calls:
        jsonschema.validate(json.loads(call.function.arguments), WEATHER)


def test_an_output_constraint_starts_after_the_budgeted_reasoning(client):
    """response_format applies after the reasoning block (server/structured.py after_reasoning):
    the grammar allows `</think>` anywhere in the open block, so the budget closes it and the
    JSON follows in content (see tests/server/test_structured_reasoning.py for the other kinds)."""
    fmt = {"type": "json_schema", "json_schema": {"name": "w", "schema": WEATHER}}
    got = chat(client, 2, max_tokens=64, response_format=fmt)
    t = tokens(got)
    assert t[2] == THINK_END and THINK_END not in t[:2] and got.message.reasoning_content
    jsonschema.validate(json.loads(got.message.content), WEATHER)


@pytest.mark.parametrize("bad", [-1, "x", 1.5, 2**31])
@pytest.mark.parametrize("route", ["chat/completions", "completions"])
def test_bad_budget_is_400_naming_it(srv, route, bad):
    body = {"model": "tiny", "max_tokens": 2, "thinking_token_budget": bad}
    body |= {"messages": ASK} if route == "chat/completions" else {"prompt": "Hi"}
    r = httpx.post(f"{srv.base_url}/v1/{route}", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "thinking_token_budget"


def test_anthropic_budget_tokens_is_enforced(srv, client):
    """thinking {enabled, budget_tokens 1024} through the anthropic SDK: 1024 tokens of thinking,
    then the answer, where the same request without a budget thinks on to max_tokens."""
    kwargs = {"enable_thinking": True}  # what /v1/messages tells the template for thinking enabled
    free = client.chat.completions.create(
        model="tiny", messages=ASK, max_tokens=1024, extra_body={"chat_template_kwargs": kwargs}, **GREEDY
    ).choices[0]
    assert free.message.content == "" and free.finish_reason == "length"  # all of it reasoning
    c = anthropic.Anthropic(base_url=srv.base_url, api_key="unused", max_retries=0)
    msg = c.messages.create(
        model="tiny",
        max_tokens=1024 + 1 + 8,
        messages=ASK,
        thinking={"type": "enabled", "budget_tokens": 1024},
        extra_body=GREEDY,
    )
    assert [b.type for b in msg.content] == ["thinking", "text"]
    assert msg.content[0].thinking == free.message.reasoning_content
    assert msg.content[1].text and msg.usage.output_tokens == 1024 + 1 + 8 and msg.stop_reason == "max_tokens"


def test_harmony_models_refuse_an_explicit_budget(tmp_path_factory):
    """gpt-oss reasons in a channel, not a <think> block: an explicit budget cannot be honoured
    there and is refused (before any backend runs, so one backend is enough)."""
    from tests.fixtures.harmony_template import build_harmony_model

    s = start_server(str(build_harmony_model(tmp_path_factory.mktemp("harmony"))), backend="torch", num_threads=1)
    try:
        body = {"model": "tiny", "messages": ASK, "max_tokens": 2, "thinking_token_budget": 8}
        r = httpx.post(f"{s.base_url}/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "thinking_token_budget", r.text
    finally:
        s.stop()
