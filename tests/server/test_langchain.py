"""LangChain's ChatOpenAI, unmodified, against a real server on 127.0.0.1 (both backends):
`.bind_tools()` gets schema-valid tool calls and `.with_structured_output()` a validated pydantic
object, from a tiny random-weight model (grammars enforce the shapes)."""

from __future__ import annotations

from typing import Literal

import langchain_openai
import pytest
from pydantic import BaseModel, Field

from tests.server.test_tool_calls import long_context_model, tool_server  # noqa: F401 (fixtures)


class GetWeather(BaseModel):
    """Get the weather forecast for a city."""

    city: Literal["Paris", "Oslo", "Lima"]
    days: int = Field(ge=1, le=7)


class Verdict(BaseModel):
    label: Literal["positive", "negative", "neutral"]
    score: int = Field(ge=0, le=10)
    reason: str = Field(max_length=16)


@pytest.fixture(scope="module")
def chat(tool_server):  # noqa: F811 (the fixture imported above)
    return langchain_openai.ChatOpenAI(
        base_url=f"{tool_server.base_url}/v1",
        api_key="unused",
        model="tiny",
        temperature=0,
        max_tokens=160,
        max_retries=0,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )


@pytest.mark.parametrize("tool_choice", ["any", "GetWeather"])
def test_bind_tools_returns_valid_calls(chat, tool_choice):
    reply = chat.bind_tools([GetWeather], tool_choice=tool_choice).invoke("Weather in Paris for 3 days?")
    assert reply.tool_calls, reply
    call = reply.tool_calls[0]
    assert call["name"] == "GetWeather"
    GetWeather.model_validate(call["args"])  # raises if the arguments break the schema


def test_with_structured_output_returns_the_model(chat):
    verdict = chat.with_structured_output(Verdict).invoke("Rate this sentence: lanterns are lovely.")
    assert isinstance(verdict, Verdict)


def test_structured_output_through_function_calling(chat):
    verdict = chat.with_structured_output(Verdict, method="function_calling").invoke("Rate: lanterns glow.")
    assert isinstance(verdict, Verdict)
