"""Structured output after the reasoning block (as vLLM does), through a real server on both
backends: on a model that reasons in `<think>` blocks, response_format / structured_outputs /
guided_* shape the answer, not the reasoning. The tiny random reasoning model of
test_thinking_budget never closes its block by itself, so thinking_token_budget ends it; then the
answer follows the constraint. A model without reasoning markers, and a prompt that closed the
block (thinking off), are constrained from their first token."""

from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest

from lantern.app.engine.reasoning import THINK_END, THINK_START
from tests.fixtures.tool_templates import QWEN3
from tests.server.conftest import start_server
from tests.server.test_thinking_budget import ASK, GREEDY, client, srv, think_model, tokens  # noqa: F401

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Oslo"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 9},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
FMT = {"type": "json_schema", "json_schema": {"name": "weather", "schema": SCHEMA}}


def chat(client, budget: int | None = None, extra: dict | None = None, **kw):  # noqa: F811
    extra = {**(extra or {}), **({} if budget is None else {"thinking_token_budget": budget})}
    kw = {"model": "tiny", "messages": ASK, "logprobs": True, **GREEDY, **kw}
    return client.chat.completions.create(**kw, extra_body=extra).choices[0]


def answer_after(got, n: int) -> str:
    """The content of a reply whose reasoning the budget closed after `n` tokens."""
    t = tokens(got)
    assert THINK_END not in t[:n] and t[n] == THINK_END, t[: n + 1]
    assert got.message.reasoning_content  # the reasoning went where it belongs
    return got.message.content


def test_json_schema_applies_after_the_open_block(client):  # noqa: F811
    got = chat(client, 5, max_tokens=80, response_format=FMT)
    jsonschema.validate(json.loads(answer_after(got, 5)), SCHEMA)
    assert got.finish_reason == "stop"
    stream = client.chat.completions.create(
        model="tiny",
        messages=ASK,
        max_tokens=80,
        stream=True,
        response_format=FMT,
        extra_body={"thinking_token_budget": 5},
        **GREEDY,
    )
    deltas = [c.choices[0].delta for c in stream if c.choices]
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == got.message.reasoning_content
    assert "".join(d.content or "" for d in deltas) == got.message.content


def test_without_a_budget_the_grammar_leaves_the_reasoning_alone(client):  # noqa: F811
    """Before this change the JSON was written inside the open block; now the random model reasons
    on (it never closes the block) and no JSON is forced into reasoning_content."""
    got = chat(client, max_tokens=24, response_format=FMT)
    assert got.finish_reason == "length" and got.message.content == ""
    assert THINK_END not in tokens(got) and not got.message.reasoning_content.lstrip().startswith("{")


@pytest.mark.parametrize(
    ("extra", "check"),
    [
        ({"structured_outputs": {"choice": ["sunny", "rain {later}"]}}, lambda c: c in ("sunny", "rain {later}")),
        ({"guided_regex": r"[0-9]{2}/[a-z]{1,4}"}, lambda c: re.fullmatch(r"[0-9]{2}/[a-z]{1,4}", c)),
        ({"guided_grammar": 'root ::= "t=" [0-9] [0-9]?'}, lambda c: re.fullmatch(r"t=[0-9]{1,2}", c)),
        ({"structured_outputs": {"grammar": 'start: "ok" item\nitem: "!" | "?"'}}, lambda c: c in ("ok!", "ok?")),
        ({"structured_outputs": {"json": SCHEMA}}, lambda c: jsonschema.validate(json.loads(c), SCHEMA) is None),
    ],
    ids=["choice", "regex", "gbnf", "lark", "json"],
)
def test_every_constraint_kind_follows_the_reasoning(client, extra, check):  # noqa: F811
    got = chat(client, 3, extra, max_tokens=60)
    content = answer_after(got, 3)
    assert check(content.strip()), content  # the layout after </think> may lead the answer


def test_an_invalid_regex_is_still_named_in_its_own_terms(client):  # noqa: F811
    with pytest.raises(openai.BadRequestError) as exc:
        chat(client, None, {"guided_regex": "[a-"}, max_tokens=4)
    assert exc.value.body["param"] == "guided_regex" and "regular expression" in exc.value.body["message"]


@pytest.fixture(scope="module")
def qwen_srv(think_model, backend):  # noqa: F811
    """The same model with Qwen3's own template: the prompt leaves the block to the model (thinking
    on) or closes an empty one (enable_thinking false)."""
    threads = {"num_threads": 1} if backend == "torch" else {}
    s = start_server(think_model, backend=backend, chat_template=QWEN3, **threads)
    yield s
    s.stop()


def test_a_block_the_model_opens_itself_comes_first(qwen_srv):
    c = openai.OpenAI(base_url=f"{qwen_srv.base_url}/v1", api_key="unused", max_retries=0)
    think = qwen_srv.engine.tokenizer.convert_tokens_to_ids(THINK_START)
    got = chat(c, 3, max_tokens=80, response_format=FMT, logit_bias={str(think): 100})
    assert tokens(got)[0] == THINK_START  # biased to open the block; the budget counts from there
    jsonschema.validate(json.loads(answer_after(got, 4)), SCHEMA)


def test_thinking_off_is_constrained_from_the_first_token(qwen_srv):
    c = openai.OpenAI(base_url=f"{qwen_srv.base_url}/v1", api_key="unused", max_retries=0)
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    got = chat(c, None, off, max_tokens=80, response_format=FMT)
    assert tokens(got)[0].lstrip().startswith("{") and not {THINK_START, THINK_END} & set(tokens(got))
    jsonschema.validate(json.loads(got.message.content), SCHEMA)
    assert not got.message.reasoning_content


def test_a_model_without_reasoning_markers_is_constrained_from_the_first_token(server):
    c = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
    got = chat(c, max_tokens=80, response_format=FMT)
    assert tokens(got)[0].lstrip().startswith("{")
    jsonschema.validate(json.loads(got.message.content), SCHEMA)
    assert getattr(got.message, "reasoning_content", None) is None
