"""Gemma 4's own argument notation (keys bare, strings between <|"|> tokens) read back as JSON, and the
`<|tool_response>` hand-over that ends its reply; the round trip through a Gemma-4-shaped template at
every split is in test_tool_parsers (format "gemma4")."""

from __future__ import annotations

import json

from lantern.server.tool_parsers import detect
from lantern.server.tool_parsers.base import ParsedDelta, assemble
from lantern.server.tool_parsers.gemma4 import Gemma4Parser, read_arguments
from tests.fixtures.tool_templates import GEMMA4

SCHEMA = {"type": "object", "properties": {"zip": {"type": "string"}, "flag": {"type": "string"}}}


def test_nested_values_and_strings_holding_markup_read_as_json():
    text = '{city:<|"|>Paris, {"FR"}<|"|>,days:3,ratio:-0.5,on:true,off:null,opts:{deep:[1,<|"|>a]b<|"|>,{k:2}]}}'
    assert read_arguments(text) == {
        "city": 'Paris, {"FR"}',
        "days": 3,
        "ratio": -0.5,
        "on": True,
        "off": None,
        "opts": {"deep": [1, "a]b", {"k": 2}]},
    }


def test_bare_values_stay_text_where_the_schema_wants_a_string():
    assert read_arguments("{zip:75001,flag:true}", SCHEMA) == {"zip": "75001", "flag": "true"}
    assert read_arguments("{zip:75001}") == {"zip": 75001}


def _streamed(text: str) -> tuple[str, list]:
    p, d = Gemma4Parser([{"name": "f", "parameters": SCHEMA}], GEMMA4), ParsedDelta()
    for ch in text:
        d.extend(p.feed(ch))
    d.extend(p.finish())
    return d.content, [(c.name, json.loads(c.arguments)) for c in assemble(d.calls)]


def test_the_tool_response_marker_ends_the_reply():
    text = 'Checking.<|tool_call>call:f{zip:<|"|>1<|"|>}<tool_call|><|tool_response>response:f{value:9}'
    assert _streamed(text) == ("Checking.", [("f", {"zip": "1"})])
    assert _streamed("All done.<|tool_response>x") == ("All done.", [])
    assert _streamed("<|tool_resp is only text") == ("<|tool_resp is only text", [])


def test_markup_that_is_no_call_stays_content():
    for text in ("<|tool_call>nonsense{x}<tool_call|> after", "text <|tool_call>call:"):
        assert _streamed(text) == (text, [])
    assert detect(GEMMA4) is Gemma4Parser
