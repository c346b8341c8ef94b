"""The terminal chat shows a reasoning model's thinking apart from its answer: dim, in a "Thinking"
block that folds once the answer starts, never sent back to the model. From the in-process engine
(split with the engine's reasoning parser) and from a live server (its reasoning_content), on each
backend. The tiny model's chat template ends the prompt inside `<think>` (DeepSeek-R1 style), so
its output is reasoning until `</think>`; a choice constraint makes it write a known reply."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

pytest.importorskip("textual")

from lantern.app.engine import AsyncEngine, SamplingParams, StructuredSpec
from lantern.app.engine.reasoning import ReasoningParser
from lantern.tui.app import ChatApp, Message
from lantern.tui.client import ChatSettings, EngineClient, HTTPClient
from tests.fixtures.tool_templates import GEMMA4, QWEN3, R1_STYLE
from tests.frontends.tui_helpers import BACKENDS, PublicSurface, wait_for

THOUGHT = "The user adds 2 and 2.\nThat makes [b]4[/b]."  # brackets: text, not Textual markup
ANSWER = "It is **4**."
FORCED = f"{THOUGHT}\n</think>\n\n{ANSWER}"  # the prompt already opened the block
SETTINGS = ChatSettings(temperature=0, max_tokens=200)


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def engine(tiny_model_dir, backend):
    eng = AsyncEngine(
        model=tiny_model_dir("llama2"),
        backend=backend,
        dtype="float32",
        block_size=4,
        num_kv_blocks=512,
        chat_template=R1_STYLE,
    )
    yield eng
    eng.shutdown()


class ForcedReply(PublicSurface):
    """The real engine (public API only) with every reply forced to `reply` by a choice
    constraint: a tiny random model never closes its reasoning by itself."""

    def __init__(self, engine: AsyncEngine, reply: str):
        super().__init__(engine)
        self.reply = reply
        self.sent: list[list[dict]] = []

    def encode_chat(self, messages, *a, **kw):
        self.sent.append(messages)
        return self._engine.encode_chat(messages, *a, **kw)

    def generate(self, prompt, params, *a, **kw):
        params.structured = StructuredSpec("choice", [self.reply])
        self._engine.compile_grammar(params.structured)
        return self._engine.generate(prompt, params, *a, **kw)


class SharedEngineClient(EngineClient):
    async def close(self) -> None:  # the engine is shared by the tests of a module
        pass


async def collect(client, messages) -> tuple[str, str, int]:
    thoughts = answer = ""
    pieces = 0
    async for d in client.stream_chat(messages, SETTINGS):
        thoughts, answer, pieces = thoughts + d.reasoning, answer + d.content, pieces + 1
        assert "think>" not in d.content + d.reasoning  # markup never reaches the screen
    return thoughts, answer, pieces


def shown(reply: Message) -> tuple[bool, bool, str, str]:
    """(Thinking block visible, folded, its text as rendered, the answer's Markdown source)."""
    box = reply.query_one("#reasoning")
    thoughts = str(reply.query_one("#thoughts").render())
    return bool(box.display), box.collapsed, thoughts, reply.query_one("#body").source


async def chat_twice(app: ChatApp) -> None:
    async with app.run_test(size=(100, 40)) as pilot:
        await pilot.click("#prompt")
        await pilot.press(*"What is 2+2?", "enter")
        await wait_for(lambda: not app.generating and len(app.history) == 2, pilot, timeout=60)
        assert app.history[1] == {"role": "assistant", "content": ANSWER, "reasoning_content": THOUGHT}
        assert shown(app.query(Message).last()) == (True, True, THOUGHT, ANSWER)
        await pilot.press(*"And 3+3?", "enter")
        await wait_for(lambda: not app.generating and len(app.history) == 4, pilot, timeout=60)


def test_in_process_reply_is_split_and_reasoning_not_sent_back(engine, backend):
    assert engine.backend_name == backend
    surface = ForcedReply(engine, FORCED)
    client = SharedEngineClient(surface, model_name="tiny")  # type: ignore[arg-type]
    ask = [{"role": "user", "content": "What is 2+2?"}]
    thoughts, answer, pieces = asyncio.run(collect(client, ask))
    assert (thoughts, answer) == (THOUGHT, ANSWER) and pieces > 5  # streamed, token by token
    asyncio.run(chat_twice(ChatApp(client, SETTINGS, stats_interval=3600)))
    # The second request carried the first answer without its reasoning.
    assert surface.sent[-1] == [*ask, {"role": "assistant", "content": ANSWER}, {"role": "user", "content": "And 3+3?"}]


# Gemma 4's thought channel, opened by the generation prompt (as the R1-style template opens <think>).
OPEN_CHANNEL = GEMMA4.replace(
    "{%- if not enable_thinking %}{{ '<|channel>thought\\n<channel|>' }}{%- endif %}", "<|channel>thought\n"
)


def test_in_process_gemma4_thought_channel_is_split(tiny_model_dir, backend):
    assert OPEN_CHANNEL != GEMMA4
    eng = AsyncEngine(model=tiny_model_dir("llama2"), backend=backend, dtype="float32", chat_template=OPEN_CHANNEL)
    try:
        client = SharedEngineClient(ForcedReply(eng, f"{THOUGHT}\n<channel|>{ANSWER}"), model_name="tiny")  # type: ignore[arg-type]
        thoughts, answer, _ = asyncio.run(collect(client, [{"role": "user", "content": "What is 2+2?"}]))
        assert (thoughts, answer) == (THOUGHT, ANSWER)
    finally:
        eng.shutdown()


def test_in_process_unforced_reasoning_matches_the_engine_text(engine):
    """Free greedy output of the tiny model: all of it is reasoning (the prompt opened the block),
    exactly the engine's own text through the parser; no answer, so the block stays open."""
    client = SharedEngineClient(PublicSurface(engine), model_name="tiny")
    ask = [{"role": "user", "content": "Hello"}]
    settings = ChatSettings(temperature=0, max_tokens=12)

    async def raw() -> str:
        ids = engine.encode_chat(ask)
        params = SamplingParams(temperature=0, max_tokens=12)
        return "".join([o.outputs[0].text_delta async for o in engine.generate(ids, params, prompt_token_ids=ids)])

    parser = ReasoningParser(in_reasoning=True)
    expected = tuple(a + b for a, b in zip(parser.feed(asyncio.run(raw())), parser.finish(), strict=True))

    async def run():
        app = ChatApp(client, settings, stats_interval=3600)
        async with app.run_test(size=(100, 40)) as pilot:
            await pilot.click("#prompt")
            await pilot.press(*"Hello", "enter")
            await wait_for(lambda: not app.generating and len(app.history) == 2, pilot, timeout=60)
            reply = app.query(Message).last()
            return app.history[1], reply.reasoning, reply.text, shown(reply)

    turn, thoughts, text, view = asyncio.run(run())
    assert expected[0] and (thoughts, text) == expected and turn["content"] == expected[1]
    if not expected[1]:
        assert view[:2] == (True, False)  # still thinking when max_tokens ended it: left open


def test_thinking_block_folds_once_when_the_answer_starts():
    class Idle:
        model_name = "tiny"

        async def stats(self) -> dict:
            return {}

        async def close(self) -> None:
            pass

    async def run():
        app = ChatApp(Idle(), stats_interval=3600)  # type: ignore[arg-type]
        async with app.run_test(size=(100, 40)) as pilot:
            reply = Message("assistant")
            await app.log_view.mount(reply)
            assert not reply.query_one("#reasoning").display  # no reasoning: no block
            await reply.set_text("", "Let me")
            assert shown(reply) == (True, False, "Let me", "")  # open while thinking
            await reply.set_text("Hi", "Let me think.")
            assert shown(reply)[:2] == (True, True)  # folded: the answer started
            reply.query_one("#reasoning").collapsed = False  # the user opens it again
            await pilot.pause()
            await reply.set_text("Hi there", "Let me think.")
            assert shown(reply) == (True, False, "Let me think.", "Hi there")  # and it stays open

    asyncio.run(run())


class Forcing(httpx.AsyncBaseTransport):
    """Adds a choice constraint to each chat request on its way to the real server."""

    def __init__(self, reply: str):
        self.inner, self.reply, self.bodies = httpx.AsyncHTTPTransport(), reply, []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/chat/completions":
            body = json.loads(request.content)
            self.bodies.append(body)
            body = {**body, "structured_outputs": {"choice": [self.reply]}}
            headers = {k: v for k, v in request.headers.items() if k.lower() != "content-length"}
            request = httpx.Request(request.method, request.url, headers=headers, json=body)
        return await self.inner.handle_async_request(request)


def http_client(srv, reply: str) -> tuple[HTTPClient, Forcing]:
    client, forcing = HTTPClient(srv.base_url), Forcing(reply)
    client.http = httpx.AsyncClient(base_url=client.base, transport=forcing, timeout=120)
    return client, forcing


def test_attached_to_a_server_shows_its_reasoning_content(tiny_model_dir, backend):
    from lantern.server.app import ServerSettings
    from tests.server.conftest import start_server

    srv = start_server(
        tiny_model_dir("llama2"), ServerSettings(served_model_name="tiny"), backend=backend, chat_template=R1_STYLE
    )
    try:
        client, forcing = http_client(srv, FORCED)

        async def run():  # one event loop: the HTTP connections belong to it
            await client.connect()
            await chat_twice(ChatApp(client, SETTINGS, stats_interval=3600))

        asyncio.run(run())
        assert forcing.bodies[-1]["messages"][1] == {"role": "assistant", "content": ANSWER}
    finally:
        srv.stop()


def test_inline_think_from_a_server_that_does_not_split_it(tiny_model_dir):
    """A server that leaves `<think>` in the content (here Lantern with --reasoning-parser none and
    a Qwen3-style template, whose output opens the block): the client splits it the same way.
    Client-side logic only, so one backend."""
    from lantern.server.app import ServerSettings
    from tests.server.conftest import start_server

    settings = ServerSettings(served_model_name="tiny", reasoning_parser="none")
    srv = start_server(tiny_model_dir("llama2"), settings, backend="torch", chat_template=QWEN3)
    try:
        client, _ = http_client(srv, f"<think>\n{FORCED}")
        client.model_name = "tiny"
        assert asyncio.run(collect(client, [{"role": "user", "content": "What is 2+2?"}]))[:2] == (THOUGHT, ANSWER)
        plain = httpx.post(
            srv.base_url + "/v1/chat/completions",
            json={
                "model": "tiny",
                "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 200,
                "structured_outputs": {"choice": [f"<think>\n{FORCED}"]},
            },
            timeout=120,
        ).json()["choices"][0]["message"]
        assert plain["content"].startswith("<think>") and "reasoning_content" not in plain  # really inline
    finally:
        srv.stop()
