"""The terminal chat when the engine fails: a request that fails inside the engine, and an engine
loop that dies, on each backend. Both are errors shown in the app (the app keeps running), never a
crash; the reply so far stays, and after a one-request failure the next prompt is answered."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

pytest.importorskip("textual")

from lantern.app.engine import (
    AsyncEngine,
    EngineConfig,
    EngineDeadError,
    InvalidRequestError,
    LLMEngine,
    RequestFailedError,
)
from lantern.tui.app import ChatApp, Message
from lantern.tui.client import ChatError, ChatSettings, EngineClient
from tests.fixtures.failures import wrap_steps
from tests.frontends.tui_helpers import BACKENDS, PublicSurface, wait_for, wait_idle

# Greedy on the tiny model runs well past a few tokens for this prompt: the fault lands mid-reply.
PROMPT = "long story"
SETTINGS = ChatSettings(temperature=0, max_tokens=64)


class SimulatedFault(RuntimeError):
    pass


def faulty_engine(
    model_dir: str, backend: str, *, execute_fails_at: int | None = None, step_fails_at: int | None = None
) -> AsyncEngine:
    """A real engine whose backend raises on its Nth forward pass (the engine fails that one
    request), or whose engine step raises (the engine loop itself dies)."""
    inner = LLMEngine(EngineConfig(model=model_dir, backend=backend, dtype="float32", block_size=4, num_kv_blocks=128))
    calls = {"execute": 0, "step": 0}
    step = inner.step

    def failing_execute(batch, run):
        calls["execute"] += 1
        if calls["execute"] == execute_fails_at:  # once: the next request runs normally
            raise SimulatedFault("simulated kernel fault")
        return run()

    def failing_step():
        calls["step"] += 1
        if step_fails_at is not None and calls["step"] >= step_fails_at:
            raise SimulatedFault("simulated scheduler fault")
        return step()

    wrap_steps(inner.backend, failing_execute)
    inner.step = failing_step
    return AsyncEngine(engine=inner)


def error_text(app: ChatApp) -> str:
    return str(app.query_one("#error").render()) if app.query_one("#error").display else ""


async def send(app: ChatApp, pilot, text: str) -> None:
    app.query_one("#prompt").value = text
    await pilot.press("enter")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_request_failing_in_the_engine_is_shown_and_the_chat_goes_on(tiny_model_dir, backend):
    engine = faulty_engine(tiny_model_dir("llama2"), backend, execute_fails_at=4)  # prefill + 2 tokens ok

    async def run():
        app = ChatApp(EngineClient(PublicSurface(engine)), SETTINGS, stats_interval=0.1)
        async with app.run_test(size=(100, 30)) as pilot:
            await send(app, pilot, PROMPT)
            await wait_for(lambda: not app.generating and "reply failed" in error_text(app), pilot)
            assert "simulated kernel fault" in error_text(app)
            # The reply so far stays in the conversation; the engine freed the request.
            assert [m["role"] for m in app.history] == ["user", "assistant"]
            assert app.history[1]["content"] and app.history[1]["content"] == app.query(Message).last().text
            await wait_idle(engine)
            assert engine.stats()["kv_usage"] == 0 and engine.dead_reason is None
            # The engine lives on: the next prompt gets a whole reply and the error goes away.
            await send(app, pilot, "Hi")
            await wait_for(lambda: not app.generating and len(app.history) == 4, pilot)
            assert app.history[3]["content"] and error_text(app) == ""
        return app.history

    try:
        history = asyncio.run(run())
    finally:
        engine.shutdown()
    # What the app got after the fault is what a fresh, healthy engine answers to the same
    # conversation: the failed request left nothing behind (no half-written cache blocks).
    healthy = AsyncEngine(
        model=tiny_model_dir("llama2"), backend=backend, dtype="float32", block_size=4, num_kv_blocks=128
    )
    try:
        assert history[3]["content"] == asyncio.run(_reply(EngineClient(healthy), history[:3]))
    finally:
        healthy.shutdown()


async def _reply(client: EngineClient, messages: list[dict]) -> str:
    return "".join([d.content async for d in client.stream_chat(messages, SETTINGS)])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_dead_engine_is_shown_in_the_app_not_a_crash(tiny_model_dir, backend):
    engine = faulty_engine(tiny_model_dir("llama2"), backend, step_fails_at=4)

    async def run():
        app = ChatApp(EngineClient(PublicSurface(engine)), SETTINGS, stats_interval=0.1)
        async with app.run_test(size=(100, 30)) as pilot:
            await send(app, pilot, PROMPT)
            await wait_for(lambda: not app.generating and "engine has stopped" in error_text(app), pilot)
            assert "simulated scheduler fault" in error_text(app)
            assert engine.dead_reason is not None and "simulated scheduler fault" in engine.dead_reason
            assert app.is_running and [m["role"] for m in app.history] == ["user", "assistant"]
            assert app.history[1]["content"]  # the reply as far as it got before the engine died
            # A new prompt is refused at once with the same cause, and handed back to the user.
            await send(app, pilot, "Hi")
            await wait_for(lambda: not app.generating and app.query_one("#prompt").value == "Hi", pilot)
            assert "engine has stopped" in error_text(app) and len(app.history) == 2
            assert len(app.query(Message)) == 2
            # The stats poll says so too, without a prompt.
            app.show_error("")
            await wait_for(lambda: "engine has stopped" in error_text(app), pilot, timeout=5)

    try:
        asyncio.run(run())
    finally:
        engine.shutdown()


class RaisingEngine:
    """Stands in for AsyncEngine where a real engine cannot be made to raise the error at will."""

    model_name = "stub"
    dead_reason = None
    chat_template = None  # no <think> blocks: every piece is answer text

    def __init__(self, error: Exception, after_deltas: list[str]):
        self.error, self.after_deltas = error, after_deltas

    def encode_chat(self, messages: list[dict]) -> list[int]:
        return [1, 2, 3]

    async def generate(self, prompt, params, request_id=None, prompt_token_ids=None):
        for delta in self.after_deltas:
            yield SimpleNamespace(outputs=[SimpleNamespace(text_delta=delta)])
        raise self.error


@pytest.mark.parametrize(
    ("error", "shown"),
    [
        (
            InvalidRequestError(
                "prompt is 900 tokens; the context is 128", param="prompt", code="context_length_exceeded"
            ),
            "prompt is 900 tokens; the context is 128",
        ),
        (
            RequestFailedError("the engine failed while running this request (X: y)"),
            "the reply failed: the engine failed while running this request (X: y)",
        ),
        (EngineDeadError("the engine has stopped: X: y"), "the engine has stopped: X: y; restart `lantern chat`"),
    ],
)
@pytest.mark.parametrize("after_deltas", [[], ["Once", " upon"]])
def test_engine_errors_become_chat_errors(error, shown, after_deltas):
    client = EngineClient(RaisingEngine(error, after_deltas))  # type: ignore[arg-type]

    async def consume() -> list[str]:
        got = []
        with pytest.raises(ChatError) as info:
            async for delta in client.stream_chat([{"role": "user", "content": "x"}], SETTINGS):
                got.append(delta.content)
        assert str(info.value).startswith(shown)
        return got

    assert asyncio.run(consume()) == after_deltas  # the text before the failure still reached the app
