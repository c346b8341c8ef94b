"""The terminal chat under Textual's pilot, against a real in-process engine on a tiny model,
on each backend (torch: the Linux default; MLX)."""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("textual")

from safetensors.torch import load_file, save_file

from lantern.app.engine import AsyncEngine
from lantern.tui.app import ChatApp, Message, split_reasoning
from lantern.tui.client import ChatSettings, EngineClient
from tests.fixtures.tiny_models import build_model
from tests.frontends.tui_helpers import BACKENDS, PublicSurface, RecordingClient, wait_for, wait_idle


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def engine(tiny_model_dir, backend):
    eng = AsyncEngine(model=tiny_model_dir("llama2"), backend=backend, dtype="float32", block_size=4, num_kv_blocks=512)
    yield eng
    eng.shutdown()


def test_prompt_streams_reply_and_stats_update(engine, backend):
    assert engine.backend_name == backend
    client = RecordingClient(engine, model_name="tiny")

    async def run():
        app = ChatApp(client, ChatSettings(temperature=0, max_tokens=12), stats_interval=0.1)
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.click("#prompt")
            await pilot.press(*"Hello there", "enter")
            await wait_for(lambda: not app.generating and len(app.history) == 2, pilot)
            replies = app.query(Message).filter(".assistant")
            assert replies.last().text and replies.last().text == app.history[-1]["content"]
            assert app.stats.get("ttft") is not None and app.stats.get("kv_usage") is not None
            assert "TTFT" in str(app.query_one("#stats").render())
            return app.history[-1]["content"]

    reply = asyncio.run(run())

    async def direct():
        out = ""
        async for d in client.stream_chat(
            [{"role": "user", "content": "Hello there"}], ChatSettings(temperature=0, max_tokens=12)
        ):
            out += d.content
        return out

    assert reply == asyncio.run(direct())  # what the app shows is the engine's own reply


@pytest.fixture(scope="module")
def long_engine(tmp_path_factory, backend):
    # A reply long enough to be stopped by a key press: a 4k context, and an end token greedy never
    # picks (its output row zeroed: a logit of exactly 0, below the largest of ~1k random logits), so
    # a reply runs to max_tokens. With the model's own end token, the reply (~680 tokens) ended
    # within a second, sometimes before the UI's first poll saw it.
    path = build_model("llama2", tmp_path_factory.mktemp("long"), max_position_embeddings=4096)
    eos = json.loads((path / "config.json").read_text())["eos_token_id"]
    weights = load_file(path / "model.safetensors")
    weights["lm_head.weight"][eos] = 0.0
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    eng = AsyncEngine(model=str(path), backend=backend, dtype="float32", block_size=16, num_kv_blocks=300)
    yield eng
    eng.shutdown()


def test_escape_stops_generation_and_settings_change_request(long_engine):
    engine = long_engine
    client = RecordingClient(engine, model_name="tiny")

    async def run():
        # Greedy on this model runs for hundreds of tokens before its EOS: time to press Esc.
        app = ChatApp(client, ChatSettings(temperature=0, max_tokens=4000))
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.click("#prompt")
            await pilot.press(*"long story", "enter")
            await wait_for(lambda: app.generating and len(app.query(Message).last().text) > 20, pilot)
            assert engine.stats()["num_running"] == 1  # the request is mid-generation
            await pilot.press("escape")
            await wait_for(lambda: not app.generating, pilot)
            await wait_idle(engine)
            assert engine.stats()["kv_usage"] == 0
            stopped_at = engine.stats()["generation_tokens"]
            await asyncio.sleep(0.5)
            assert engine.stats()["generation_tokens"] == stopped_at  # nothing more was generated
            # Settings: max tokens 3 and a system prompt, applied to the next request.
            await pilot.press("ctrl+s")
            await pilot.pause()
            screen = app.screen
            screen.query_one("#max_tokens").value = "3"
            screen.query_one("#temperature").value = "0"
            screen.query_one("#system").value = "Be brief."
            await pilot.click("#save")
            await pilot.pause()
            assert app.settings.max_tokens == 3
            before = engine.stats()["generation_tokens"]
            await pilot.click("#prompt")
            await pilot.press(*"again", "enter")
            await wait_for(lambda: not app.generating and app.history[-1]["role"] == "assistant", pilot)
            messages, settings = client.sent[-1]
            assert messages[0] == {"role": "system", "content": "Be brief."}
            assert settings.max_tokens == 3 and settings.temperature == 0
            assert 1 <= engine.stats()["generation_tokens"] - before <= 3  # max tokens 3 was obeyed
            # The stopped reply stayed in the conversation as far as it got.
            assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
            # New chat in the middle of a reply: it stops, and the late reply does not leak into the new chat.
            # (From a fresh chat with the first prompt again, so the reply is the same long one.)
            await pilot.press("ctrl+n")
            await pilot.pause()
            app.settings = ChatSettings(temperature=0, max_tokens=4000)
            await pilot.press(*"long story", "enter")
            await wait_for(lambda: app.generating and len(app.query(Message).last().text) > 20, pilot)
            await pilot.press("ctrl+n")
            await wait_for(lambda: not app.generating, pilot)
            assert app.history == [] and not app.query(Message)
            await wait_idle(engine)

    asyncio.run(run())


def test_bad_settings_are_refused_and_errors_shown(engine):
    client = RecordingClient(engine, model_name="tiny")

    async def run():
        app = ChatApp(client)
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.press("ctrl+s")
            await pilot.pause()
            app.screen.query_one("#temperature").value = "hot"
            await pilot.click("#save")
            await pilot.pause()
            assert "must be numbers" in str(app.screen.query_one("#settings-error").render())
            await pilot.press("escape")
            await pilot.pause()
            # A prompt longer than the context: shown in the app, no traceback.
            await pilot.click("#prompt")
            app.query_one("#prompt").value = "word " * 400
            await pilot.press("enter")
            await wait_for(lambda: not app.generating and app.query_one("#error").display, pilot)
            assert "context" in str(app.query_one("#error").render())
            # The failed turn is taken out and the prompt given back to edit.
            assert app.history == [] and not app.query(Message)
            assert app.query_one("#prompt").value == ("word " * 400).strip()
            app.query_one("#prompt").value = "Hi"
            await pilot.press("enter")
            await wait_for(lambda: not app.generating and len(app.history) == 2, pilot)
            assert [m["role"] for m in client.sent[-1][0]] == ["user"]
            assert not app.query_one("#error").display

    asyncio.run(run())


def test_reasoning_is_split_out():
    assert split_reasoning("<think>plan it</think>Answer") == ("plan it", "Answer")
    assert split_reasoning("<think>still thinking") == ("still thinking", "")
    assert split_reasoning("No thoughts") == (None, "No thoughts")


class IdleClient:
    """A client that is never asked anything: the screens look the same whatever runs the model."""

    model_name = "tiny"

    def stream_chat(self, messages, settings):
        raise AssertionError("no prompt is sent in the snapshot tests")

    async def stats(self) -> dict:
        return {}

    async def close(self) -> None:
        pass


def test_snapshots(snap_compare):
    assert snap_compare(ChatApp(IdleClient(), stats_interval=3600), terminal_size=(100, 30))

    async def open_settings(pilot):
        await pilot.press("ctrl+s")
        await pilot.pause()

    assert snap_compare(ChatApp(IdleClient(), stats_interval=3600), terminal_size=(100, 30), run_before=open_settings)


def test_model_loads_inside_the_app_and_failures_are_shown_there(tiny_model_dir, backend):
    """`lantern chat` opens at once and loads the model in the background: "Loading…", then the
    model's name; a model that cannot load, or a server that is not there, is an error in the app."""
    from lantern.tui.client import HTTPClient

    path = tiny_model_dir("llama2")
    release = asyncio.Event()
    loaded: list[AsyncEngine] = []

    async def load_real():
        await release.wait()
        engine = await asyncio.to_thread(AsyncEngine, model=path, backend=backend, dtype="float32", num_kv_blocks=64)
        loaded.append(engine)
        return EngineClient(PublicSurface(engine))

    async def load_missing():
        return EngineClient(await asyncio.to_thread(AsyncEngine, model=str(path) + "-missing", backend=backend))

    async def load_reranker():  # a model that serves no chat: said at start, not per message
        from tests.fixtures.tiny_rerankers import build_cross_encoder

        folder = build_cross_encoder(Path(tempfile.mkdtemp()) / "reranker", "bert")
        return EngineClient(await asyncio.to_thread(AsyncEngine, model=str(folder), backend=backend))

    async def connect_unreachable():
        client = HTTPClient("http://127.0.0.1:9")  # the discard port: nothing listens
        await client.connect()
        return client

    async def run():
        app = ChatApp(connect=load_real, settings=ChatSettings(temperature=0, max_tokens=4), stats_interval=0.1)
        async with app.run_test(size=(100, 30)) as pilot:
            assert app.sub_title == "Loading…"
            await pilot.click("#prompt")
            await pilot.press(*"Hi", "enter")  # refused politely while loading
            await pilot.pause()
            assert app.history == [] and not app.query(Message)
            release.set()
            await wait_for(lambda: app.client is not None, pilot, timeout=120)
            assert app.sub_title == os.path.basename(path)  # AsyncEngine.model_name
            assert loaded[0].backend_name == backend
            await pilot.press(*"Hi", "enter")
            await wait_for(lambda: len(app.history) == 2 and not app.generating, pilot)
        for connect, words in (
            (load_missing, "not a model folder"),
            (load_reranker, "serves relevance scores (task score), not chat"),
            (connect_unreachable, "cannot reach"),
        ):
            app = ChatApp(connect=connect)
            async with app.run_test(size=(100, 30)) as pilot:
                await wait_for(lambda app=app: app.query_one("#error").display, pilot, timeout=60)
                assert "could not start the chat" in str(app.query_one("#error").render())
                assert words in str(app.query_one("#error").render())
                assert app.sub_title == "not loaded"

    asyncio.run(run())


def test_chats_are_saved_and_reopened(engine, tmp_path):
    from textual.content import Content

    from lantern.tui.history import ChatStore, HistoryScreen

    client = RecordingClient(engine, model_name="tiny")
    store = ChatStore(tmp_path / "chats")
    (tmp_path / "chats").mkdir()
    (tmp_path / "chats" / "broken.json").write_text("{not json")  # skipped, not fatal

    async def send(app, pilot, text):
        turns = len(app.history)
        app.query_one("#prompt").value = text
        await pilot.press("enter")
        await wait_for(lambda: not app.generating and len(app.history) == turns + 2, pilot)

    async def run():
        app = ChatApp(client, ChatSettings(temperature=0, max_tokens=6), stats_interval=3600, store=store)
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.click("#prompt")
            await send(app, pilot, "First   question")
            first_id = app.chat_id
            assert [c.title for c in store.list()] == ["First question"]
            assert store.load(first_id).messages == app.history
            await pilot.press("ctrl+n")
            await send(app, pilot, "Second [/b] x[0]")  # the user's brackets are text, not markup
            assert [c.title for c in store.list()] == ["Second [/b] x[0]", "First question"]
            # Reopen the first chat from the list (newest first: Down moves to it) and go on with it.
            await pilot.press("ctrl+o")
            await pilot.pause()
            assert isinstance(app.screen, HistoryScreen)
            chats = app.screen.query_one("#chats")
            assert chats.option_count == 2
            shown = Content.from_markup(chats.get_option_at_index(0).prompt).plain  # as rendered
            assert shown.startswith("Second [/b] x[0]  ")
            await pilot.press("down", "enter")
            await wait_for(lambda: app.chat_id == first_id and len(app.query(Message)) == 2, pilot)
            assert app.history == store.load(first_id).messages
            await pilot.click("#prompt")
            await send(app, pilot, "Follow-up")
            assert [m["content"] for m in client.sent[-1][0]][0] == "First   question"  # sent with its past
            assert len(store.load(first_id).messages) == 4 and len(store.list()) == 2
            # Delete removes the highlighted chat (the first one, now the most recently updated).
            await pilot.press("ctrl+o")
            await pilot.pause()
            await pilot.press("delete")
            await pilot.pause()
            assert [c.title for c in store.list()] == ["Second [/b] x[0]"]
            await pilot.press("escape")
            await pilot.pause()
            assert not isinstance(app.screen, HistoryScreen)

    asyncio.run(run())


def test_attached_to_a_server_over_http(tmp_path, backend):
    """`lantern chat --url … --api-key …`: the reply streams from a live server and matches its
    non-streaming answer, the stats come from /metrics, Esc ends the request on the server."""
    import httpx

    from lantern.server.app import ServerSettings
    from lantern.tui.client import ChatError, HTTPClient
    from tests.server.conftest import start_server

    # A 4k context: greedy replies run for hundreds of tokens, long enough to press Esc.
    path = build_model("llama2", tmp_path, max_position_embeddings=4096)
    srv = start_server(
        str(path),
        ServerSettings(served_model_name="tiny", api_key="k1"),
        backend=backend,
        block_size=16,
        num_kv_blocks=300,
    )
    assert srv.engine.backend_name == backend
    auth = {"Authorization": "Bearer k1"}

    def running() -> float:
        text = httpx.get(srv.base_url + "/metrics", headers=auth).text
        return float(text.split('lantern:num_requests_running{model_name="tiny"} ')[1].split()[0])

    async def run():
        with pytest.raises(ChatError, match="API key"):
            await HTTPClient(srv.base_url, api_key="wrong").connect()
        client = HTTPClient(srv.base_url + "/v1", api_key="k1")
        await client.connect()
        assert client.model_name == "tiny"
        app = ChatApp(client, ChatSettings(temperature=0, max_tokens=12), stats_interval=0.1)
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.click("#prompt")
            await pilot.press(*"Hello there", "enter")
            await wait_for(lambda: not app.generating and len(app.history) == 2, pilot)
            expected = httpx.post(
                srv.base_url + "/v1/chat/completions",
                headers=auth,
                json={
                    "model": "tiny",
                    "messages": [{"role": "user", "content": "Hello there"}],
                    "temperature": 0,
                    "max_tokens": 12,
                },
            ).json()["choices"][0]["message"]["content"]
            assert app.history[1]["content"] == expected and expected
            await wait_for(lambda: app.stats.get("kv_usage") is not None and app.stats.get("running") == 0, pilot)
            app.settings = ChatSettings(temperature=0, max_tokens=4000)
            await pilot.press(*"long story", "enter")
            await wait_for(lambda: app.generating and len(app.query(Message).last().text) > 20, pilot)
            assert running() == 1
            await pilot.press("escape")
            await wait_for(lambda: not app.generating, pilot)
            deadline = time.monotonic() + 5
            while running() != 0 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert running() == 0  # the server dropped the request when the stream closed

    try:
        asyncio.run(run())
    finally:
        srv.stop()
