"""Constrained output over HTTP on both backends: response_format (OpenAI, and the SDK's parse()),
vLLM's structured_outputs and guided_* fields, allowed_token_ids, and the 400s naming the field.

The random tiny model writes whatever the mask allows, so every schema here bounds its output
(maxLength, maxItems, integer ranges, additionalProperties false): the grammar has to end it."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Literal

import httpx
import jsonschema
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field

from tests.fixtures.tiny_models import build_model
from tests.server.conftest import start_server

_NAMES = st.from_regex(r"[a-z][a-z0-9_]{0,7}", fullmatch=True)
_SCALARS = st.one_of(st.text(max_size=6), st.integers(-50, 50), st.booleans(), st.none())
_LEAVES = st.one_of(
    st.builds(
        lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span},
        st.integers(-999, 999),
        st.integers(0, 5000),
    ),
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.builds(
        lambda lo, more: {"type": "string", "minLength": lo, "maxLength": lo + more},
        st.integers(0, 3),
        st.integers(0, 8),
    ),
    st.lists(_SCALARS, min_size=1, max_size=4, unique_by=json.dumps).map(lambda v: {"enum": v}),
    st.sampled_from(["^[a-z]{2,5}$", "^[0-9]{3}-[0-9]{2}$", "^(red|green|blue)$"]).map(
        lambda p: {"type": "string", "pattern": p}
    ),
    _SCALARS.map(lambda c: {"const": c}),
    st.builds(lambda n: {"type": ["string", "null"], "maxLength": n}, st.integers(0, 5)),
)


def _objects(children: st.SearchStrategy) -> st.SearchStrategy:
    def with_required(props: dict) -> st.SearchStrategy:
        return st.lists(st.sampled_from(sorted(props)), unique=True).map(
            lambda req: {"type": "object", "properties": props, "required": req, "additionalProperties": False}
        )

    return st.dictionaries(_NAMES, children, min_size=1, max_size=4).flatmap(with_required)


def _extend(children: st.SearchStrategy) -> st.SearchStrategy:
    arrays = st.builds(
        lambda items, lo, more: {"type": "array", "items": items, "minItems": lo, "maxItems": lo + more},
        children,
        st.integers(0, 2),
        st.integers(0, 2),
    )
    any_of = st.lists(children, min_size=2, max_size=3).map(lambda xs: {"anyOf": xs})
    return st.one_of(arrays, _objects(children), any_of)


SCHEMAS = _objects(st.recursive(_LEAVES, _extend, max_leaves=6))


@pytest.fixture(scope="module")
def server(tmp_path_factory, backend):
    # A longer context than the shared tiny model: 50 nested schemas' worth of JSON at once.
    model = build_model("llama2", tmp_path_factory.mktemp("llama_4k"), max_position_embeddings=4096)
    srv = start_server(str(model), backend=backend, num_kv_blocks=16384, max_num_seqs=64)
    yield srv
    srv.stop()


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)


@settings(max_examples=50, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(schema=SCHEMAS, seed=st.integers(0, 2**20))
def test_fifty_generated_schemas_are_followed(server, schema, seed):
    """Each schema through chat's response_format (default bounded whitespace, greedy and sampled)
    and completions' structured_outputs (compact JSON), all four requests at once."""
    client = openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0, timeout=600)

    async def one(i: int) -> tuple[str, str | None]:
        common = {"model": "tiny", "max_tokens": 3000, "temperature": [0.0, 1.0][i % 2], "seed": seed}
        if i < 2:
            fmt = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema, "strict": True}}
            r = await client.chat.completions.create(
                messages=[{"role": "user", "content": "Answer in JSON."}], response_format=fmt, **common
            )
            return r.choices[0].message.content or "", r.choices[0].finish_reason
        so = {"json": schema, "disable_any_whitespace": True}
        c = await client.completions.create(prompt="JSON:", extra_body={"structured_outputs": so}, **common)
        return c.choices[0].text, c.choices[0].finish_reason

    async def run_all() -> list[tuple[str, str | None]]:
        try:
            return await asyncio.gather(*(one(i) for i in range(4)))
        finally:
            await client.close()

    for i, (text, finish) in enumerate(asyncio.run(run_all())):
        assert finish == "stop", (i, text)
        jsonschema.validate(json.loads(text), schema)
        if i >= 2:  # no whitespace at all outside strings (a number may be written as JSON allows: -0, 1.50)
            assert not re.search(r"\s", re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)), (i, text)


class Item(BaseModel):
    name: str = Field(max_length=8)
    qty: int = Field(ge=0, le=99)


class Order(BaseModel):
    items: list[Item] = Field(max_length=3)
    urgent: bool
    channel: Literal["web", "phone"] | None


def test_sdk_parse_returns_the_pydantic_model(server):
    client = _client(server)
    for seed in range(3):
        r = client.chat.completions.parse(
            model="tiny",
            messages=[{"role": "user", "content": "Place an order."}],
            response_format=Order,
            max_tokens=1500,
            temperature=1.0,
            seed=seed,
        )
        msg = r.choices[0].message
        assert r.choices[0].finish_reason == "stop"
        assert isinstance(msg.parsed, Order) and Order.model_validate_json(msg.content) == msg.parsed


def test_streamed_structured_output_reassembles(server):
    client = _client(server)
    schema = Order.model_json_schema()
    stream = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "JSON please"}],
        response_format={"type": "json_schema", "json_schema": {"name": "order", "schema": schema}},
        max_tokens=1500,
        temperature=0,
        stream=True,
    )
    parts, finish = [], None
    for chunk in stream:
        for c in chunk.choices:
            parts.append(c.delta.content or "")
            finish = c.finish_reason or finish
    assert finish == "stop"
    Order.model_validate_json("".join(parts))


@pytest.mark.parametrize(
    ("body", "check"),
    [
        ({"guided_regex": r"[a-d]{3}-[0-9]{1,4}"}, lambda t: re.fullmatch(r"[a-d]{3}-[0-9]{1,4}", t)),
        ({"structured_outputs": {"regex": r"(ab|cd){2,3}!"}}, lambda t: re.fullmatch(r"(ab|cd){2,3}!", t)),
        ({"guided_choice": ["alpha", "beta", "γάμμα"]}, lambda t: t in ("alpha", "beta", "γάμμα")),
        ({"structured_outputs": {"choice": ["left", "right"]}}, lambda t: t in ("left", "right")),
        ({"guided_grammar": 'start: "<" WORD ">"\nWORD: /[a-z]{1,4}/'}, lambda t: re.fullmatch(r"<[a-z]{1,4}>", t)),
        ({"structured_outputs": {"grammar": 'root ::= "n=" [0-9]{2}'}}, lambda t: re.fullmatch(r"n=[0-9]{2}", t)),
        (
            {"guided_json": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "maxItems": 4}},
            lambda t: jsonschema.validate(json.loads(t), {"type": "array", "maxItems": 4}) is None,
        ),
    ],
)
def test_regex_choice_grammar_and_guided_fields_are_honoured(server, body, check):
    r = httpx.post(
        server.base_url + "/v1/completions",
        json={"model": "tiny", "prompt": "Say:", "max_tokens": 100, "temperature": 1.0, "seed": 4, "n": 4, **body},
        timeout=300,
    )
    assert r.status_code == 200, r.text
    for c in r.json()["choices"]:
        assert c["finish_reason"] == "stop" and check(c["text"]), c["text"]


def test_allowed_token_ids_are_the_only_tokens(server):
    tok = server.engine.tokenizer
    allowed = sorted(set(tok.encode("red green blue", add_special_tokens=False)))
    body = {"model": "tiny", "prompt": "Hi", "max_tokens": 12, "temperature": 1.0, "logprobs": 0}
    r = httpx.post(server.base_url + "/v1/completions", json={**body, "allowed_token_ids": allowed}, timeout=300)
    assert r.status_code == 200, r.text
    tokens = r.json()["choices"][0]["logprobs"]["tokens"]
    assert len(tokens) == 12 and set(tokens) <= {tok.decode([t]) for t in allowed}


def _post(server, route: str, body: dict) -> httpx.Response:
    base = {"model": "tiny", "max_tokens": 5}
    if route == "chat":
        return httpx.post(
            server.base_url + "/v1/chat/completions",
            json={**base, "messages": [{"role": "user", "content": "x"}], **body},
            timeout=60,
        )
    return httpx.post(server.base_url + "/v1/completions", json={**base, "prompt": "x", **body}, timeout=60)


BAD = [
    (
        "chat",
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
        "response_format",
    ),
    ("chat", {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format"),
    ("chat", {"response_format": {"type": "xml"}}, "response_format"),
    ("chat", {"response_format": {"type": "json_object"}, "guided_regex": "a+"}, "guided_regex"),
    ("completions", {"guided_regex": "a(b"}, "guided_regex"),
    ("completions", {"guided_json": "{not json"}, "guided_json"),
    ("completions", {"guided_grammar": "start: missing_rule"}, "guided_grammar"),
    ("completions", {"structured_outputs": {"grammar": "root ::= ("}}, "structured_outputs.grammar"),
    ("completions", {"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs.choice"),
    ("completions", {"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs.structural_tag"),
    ("completions", {"guided_choice": []}, "guided_choice"),
    ("completions", {"guided_regex": "a+", "guided_whitespace_pattern": " *"}, "guided_whitespace_pattern"),
    (
        "completions",
        {"guided_json": {"type": "object"}, "guided_decoding_backend": "outlines"},
        "guided_decoding_backend",
    ),
    ("completions", {"guided_json": {"type": "object"}, "guided_decoding_backend": ["x"]}, "guided_decoding_backend"),
    ("completions", {"allowed_token_ids": [0, 10**6]}, "allowed_token_ids"),
    ("completions", {"allowed_token_ids": []}, "allowed_token_ids"),
]


@pytest.mark.parametrize(("route", "body", "param"), BAD)
@pytest.mark.parametrize("stream", [False, True])
def test_invalid_constraints_are_400_naming_the_field(server, route, body, param, stream):
    r = _post(server, route, {**body, "stream": stream})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error", err
