"""The browser chat (`--ui-server`) in headless Debian Chromium, driven by Playwright, against a
live server on 127.0.0.1. Each test leaves a screenshot of its end state in its tmp_path."""

from __future__ import annotations

import os
import shutil

import httpx
import pytest

from lantern.server.app import ServerSettings
from tests.server.conftest import start_server

pytest.importorskip("mlx.core")
sync_api = pytest.importorskip("playwright.sync_api")

CHROMIUM = os.environ.get("LANTERN_CHROMIUM", "/usr/bin/chromium")
pytestmark = pytest.mark.skipif(
    not shutil.which(CHROMIUM), reason=f"no Chromium at {CHROMIUM} (apt-get install chromium)"
)
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]


@pytest.fixture(scope="module")
def ui_server(tmp_path_factory):
    # A 4k context: greedy replies run for hundreds of tokens, long enough to press Stop.
    from tests.fixtures.tiny_models import build_model

    path = build_model("llama2", tmp_path_factory.mktemp("long"), max_position_embeddings=4096)
    srv = start_server(
        str(path), ServerSettings(served_model_name="tiny", ui_server=True), block_size=16, num_kv_blocks=300
    )
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield b
        b.close()


@pytest.fixture
def page(browser, tmp_path, request):
    size = getattr(request, "param", {"width": 1280, "height": 800})
    context = browser.new_context(viewport=size)
    pg = context.new_page()
    yield pg
    pg.screenshot(path=str(tmp_path / f"{request.node.name}.png"), full_page=True)
    context.close()


def set_settings(page, temperature=None, max_tokens=None, api_key=None):
    page.click("#open-settings")
    if temperature is not None:
        page.fill("#set-temperature", str(temperature))
    if max_tokens is not None:
        page.fill("#set-max-tokens", str(max_tokens))
    if api_key is not None:
        page.fill("#set-api-key", api_key)
    page.click("#save-settings")


def wait_idle(page):
    page.wait_for_selector("#send", state="visible", timeout=60_000)


@pytest.mark.parametrize(
    "page", [{"width": 1280, "height": 800}, {"width": 375, "height": 740}], indirect=True, ids=["desktop", "phone"]
)
def test_send_message_streams_reply_and_survives_reload(ui_server, page):
    page.goto(ui_server.base_url + "/")
    page.wait_for_function("document.querySelector('#model').options.length > 0")
    assert page.input_value("#model") == "tiny"
    set_settings(page, temperature=0, max_tokens=12)
    page.fill("#input", "Hello there")
    page.press("#input", "Enter")
    wait_idle(page)
    reply = page.inner_text(".msg.assistant")
    expected = httpx.post(
        ui_server.base_url + "/v1/chat/completions",
        json={
            "model": "tiny",
            "messages": [{"role": "user", "content": "Hello there"}],
            "temperature": 0,
            "max_tokens": 12,
        },
    ).json()["choices"][0]["message"]["content"]
    assert reply.strip() and reply.split() == expected.split()
    assert page.inner_text("#stat-ttft") != "–"
    page.reload()
    page.wait_for_selector(".msg.user")
    assert page.inner_text(".msg.user") == "Hello there"
    assert page.locator("#conversations li .title").first.inner_text() == "Hello there"
    if page.viewport_size["width"] < 700:  # phone: the sidebar is a drawer that opens on demand
        assert not page.is_visible("#new-chat") or page.locator("#sidebar").bounding_box()["x"] < 0
        page.click("#toggle-sidebar")
        page.wait_for_timeout(300)
        assert page.locator("#sidebar").bounding_box()["x"] >= 0
        page.mouse.click(340, 400)  # beside the drawer: the backdrop closes it
        page.wait_for_timeout(300)
        assert page.locator("#sidebar").bounding_box()["x"] < 0
        page.click("#toggle-sidebar")  # the end state kept as the screenshot: drawer open
        page.wait_for_timeout(300)


def test_stop_button_ends_generation(ui_server, page):
    page.goto(ui_server.base_url + "/")
    page.wait_for_function("document.querySelector('#model').options.length > 0")
    set_settings(page, temperature=0, max_tokens=4000)
    page.fill("#input", "long story")
    page.press("#input", "Enter")
    page.wait_for_selector("#stop", state="visible")
    page.wait_for_function("document.querySelector('.msg.assistant').textContent.length > 0")
    assert 'lantern:num_requests_running{model_name="tiny"} 1.0' in httpx.get(ui_server.base_url + "/metrics").text
    page.click("#stop")
    wait_idle(page)
    for _ in range(100):
        metrics = httpx.get(ui_server.base_url + "/metrics").text
        if 'lantern:num_requests_running{model_name="tiny"} 0.0' in metrics:
            break
        page.wait_for_timeout(50)
    assert 'lantern:num_requests_running{model_name="tiny"} 0.0' in metrics
    assert page.is_hidden("#error")


def test_copy_buttons_and_deleting_a_conversation(ui_server, page):
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=ui_server.base_url)
    page.goto(ui_server.base_url + "/")
    reply = 'Use print:\n\n```python\nprint("hi")  # say hi\n```\n\nThat is all.'
    page.evaluate(
        """(reply) => localStorage.setItem("lantern.conversations", JSON.stringify([
        {id: "a", title: "How do I print?", messages: [{role: "user", content: "How do I print?"},
                                                       {role: "assistant", content: reply}]},
        {id: "b", title: "Second chat",
         messages: [{role: "user", content: "Hi"}, {role: "assistant", content: "Hello"}]},
    ]))""",
        reply,
    )
    page.reload()
    page.wait_for_selector(".msg.assistant pre")
    assert page.inner_text(".msg.assistant pre code") == 'print("hi")  # say hi'
    page.click(".msg.assistant pre button.copy")
    page.wait_for_function("document.querySelector('.msg.assistant pre button.copy').textContent === 'Copied'")
    assert page.evaluate("navigator.clipboard.readText()") == 'print("hi")  # say hi'
    page.click(".msg-actions button.copy")  # the whole reply, as Markdown
    page.wait_for_function("document.querySelector('.msg-actions button.copy').textContent === 'Copied'")
    assert page.evaluate("navigator.clipboard.readText()") == reply
    # Delete the open conversation: the next one opens, and the deletion survives a reload.
    page.click("#conversations li.active .delete")
    assert page.locator("#conversations li .title").all_inner_texts() == ["Second chat"]
    assert page.inner_text(".msg.user") == "Hi"
    page.reload()
    page.wait_for_selector(".msg.user")
    assert page.locator("#conversations li .title").all_inner_texts() == ["Second chat"]


def test_failed_request_hands_the_prompt_back(ui_server, page):
    page.goto(ui_server.base_url + "/")
    page.wait_for_function("document.querySelector('#model').options.length > 0")
    prompt = "word " * 5000  # longer than the model's 4k context: the server answers 400
    page.fill("#input", prompt)
    page.press("#input", "Enter")
    page.wait_for_selector("#error", state="visible")
    assert "400" in page.inner_text("#error") and "context" in page.inner_text("#error")
    assert page.locator(".msg").count() == 0  # the turn was taken back out
    assert page.input_value("#input") == prompt.strip()
    set_settings(page, temperature=0, max_tokens=4)
    page.fill("#input", "short one")
    page.press("#input", "Enter")
    wait_idle(page)
    assert page.is_hidden("#error")
    assert page.locator(".msg.user").all_inner_texts() == ["short one"]


def test_wrong_api_key_shows_clear_message(tiny_model_dir, browser, tmp_path):
    srv = start_server(tiny_model_dir("llama2"), ServerSettings(served_model_name="tiny", ui_server=True, api_key="k1"))
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    try:
        page.goto(srv.base_url + "/")  # the page itself loads without the key
        page.wait_for_selector("#error", state="visible")
        assert "API key" in page.inner_text("#error")
        set_settings(page, api_key="wrong")
        page.fill("#input", "hi")
        page.press("#input", "Enter")
        page.wait_for_function("document.querySelector('#error').textContent.includes('API key')")
        set_settings(page, api_key="k1", temperature=0, max_tokens=4)
        page.wait_for_function("document.querySelector('#model').options.length > 0")
        page.fill("#input", "hi again")
        page.press("#input", "Enter")
        wait_idle(page)
        assert page.is_hidden("#error")
        assert page.locator(".msg.assistant").last.inner_text().strip()
    finally:
        page.screenshot(path=str(tmp_path / "wrong_api_key.png"), full_page=True)
        context.close()
        srv.stop()


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_non_chat_model_turns_the_chat_off_saying_why(browser, tmp_path, backend):
    """An embedding model behind --ui-server: the page says at once what the model serves and where, and the
    composer is disabled, instead of answering each message with a wrong-task error."""
    from tests.fixtures.tiny_encoders import build_bert

    srv = start_server(
        str(build_bert(tmp_path / "embed", "mean")), ServerSettings(served_model_name="tiny", ui_server=True),
        backend=backend,
    )  # fmt: skip
    try:
        assert httpx.get(srv.base_url + "/v1/models").json()["data"][0]["task"] == "embed"
        context = browser.new_context()
        page = context.new_page()
        page.goto(srv.base_url + "/")
        page.wait_for_selector("#error:not([hidden])", timeout=30_000)
        notice = page.inner_text("#error")
        assert "embeddings" in notice and "/v1/embeddings" in notice and "not chat" in notice
        assert page.is_disabled("#input") and page.is_disabled("#send")
        page.screenshot(path=str(tmp_path / "non-chat.png"))
        assert page.locator("#messages .message").count() == 0
        context.close()
    finally:
        srv.stop()
