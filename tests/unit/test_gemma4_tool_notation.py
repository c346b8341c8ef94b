"""Gemma 4's own argument notation (keys bare, strings between <|"|> tokens) read back as JSON, and the
`<|tool_response>` hand-over that ends its reply; the round trip through a Gemma-4-shaped template at
every split is in test_tool_parsers (format "gemma4")."""

from __future__ import annotations

import json

import jsonschema
import pytest

from lantern.server.tool_parsers import detect
from lantern.server.tool_parsers.base import ParsedDelta, assemble
from lantern.server.tool_parsers.gemma4 import Gemma4Parser, read_arguments
from lantern.server.tool_parsers.grammar import check_grammar, literal_maker, tool_grammar
from tests.fixtures.tool_templates import GEMMA4
from tests.unit.test_tool_parsers import accepts, tok  # noqa: F401

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


# -- the forcing grammar: values typed by the schema, in Gemma's notation ---------------------------------

LOOSE = {
    "type": "object",
    "properties": {
        "filters": {"type": "object", "description": "free-form: any keys"},
        "target": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 3}, {"type": "string", "enum": ["all"]}]},
        "limit": {"type": ["integer", "null"]},
        "extra": {"description": "no type said"},
        "tags": {"type": "array"},
        "note": {"type": ["string", "null"]},
        "size": {"type": ["string", "number"]},
        "counts": {"type": "object", "additionalProperties": {"type": "integer"}},
        "none": {"type": "object", "additionalProperties": False},
    },
    "required": ["filters", "target"],
}


@pytest.fixture(scope="module")
def forced(tok):  # noqa: F811
    tools = [{"name": "search", "parameters": LOOSE}]
    lit = literal_maker(tok)
    grammar = tool_grammar(Gemma4Parser.grammar(tools, False, lit, GEMMA4), lit)
    check_grammar(grammar)
    return lambda args: accepts(tok, grammar, f"<|tool_call>call:search{args}<tool_call|>")


@pytest.mark.parametrize(
    "args, want",
    [
        ("{filters:{},target:2}", {"filters": {}, "target": 2}),
        (
            '{filters:{lang:<|"|>fr<|"|>,max:-1.5,deep:{ok:true,list:[1,null]}},target:<|"|>all<|"|>}',
            {"filters": {"lang": "fr", "max": -1.5, "deep": {"ok": True, "list": [1, None]}}, "target": "all"},
        ),
        (
            '{extra:[<|"|>a<|"|>,{k:1}],filters:{<|"|>quoted key<|"|>:3},limit:null,tags:[1,<|"|>x<|"|>],target:0}',
            {"extra": ["a", {"k": 1}], "filters": {"quoted key": 3}, "limit": None, "tags": [1, "x"], "target": 0},
        ),
        ("{filters:{},limit:12,target:3}", {"filters": {}, "limit": 12, "target": 3}),
        # an optional string stays null, not the text "null"; typed map values; a closed empty object
        (
            "{counts:{a:1,b:-2},filters:{},none:{},note:null,target:1}",
            {"counts": {"a": 1, "b": -2}, "filters": {}, "none": {}, "note": None, "target": 1},
        ),
        ('{filters:{},note:<|"|>hi<|"|>,target:1}', {"filters": {}, "note": "hi", "target": 1}),
        ("{filters:{},size:3,target:1}", {"filters": {}, "size": 3, "target": 1}),  # an integer is a number
    ],
)
def test_loose_schemas_take_any_value_of_their_kind(forced, args, want):
    assert forced(args), args
    got = read_arguments(args, LOOSE)
    assert got == want
    jsonschema.validate(got, LOOSE)


@pytest.mark.parametrize(
    "args",
    [
        "{filters:{},target:7}",  # outside the integer branch, and not the enum
        '{filters:{},target:<|"|>some<|"|>}',  # a string, but not the enum's
        "{filters:[],target:1}",  # a list is not an object
        '{filters:{},limit:<|"|>9<|"|>,target:1}',  # integer or null, not a string
        "{target:1}",  # filters is required
        '{counts:{a:<|"|>x<|"|>},filters:{},target:1}',  # map values must be integers
        "{filters:{},none:{k:1},target:1}",  # no keys allowed there
    ],
)
def test_values_outside_the_schema_are_refused(forced, args):
    assert not forced(args), args
