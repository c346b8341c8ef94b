"""The browser chat shows a reasoning model's thinking apart from its answer, in headless Chromium
against a live server on each backend: streamed `delta.reasoning_content` fills a "Thinking" block
above the answer that is open while the model thinks and folds once the answer starts; it is kept
with the conversation but never sent back to the model.

The tiny model's chat template ends the prompt inside `<think>` (DeepSeek-R1 style), so what it
writes is reasoning until `</think>`. To get a known reply with an answer after the reasoning, the
test adds a choice constraint to the page's request on its way to the server (Playwright routing)."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from lantern.server.app import ServerSettings
from tests.fixtures.tool_templates import R1_STYLE
from tests.server.conftest import BACKENDS, start_server

sync_api = pytest.importorskip("playwright.sync_api")

# As in test_browser_chat.py (not imported from it: that module needs MLX, this one runs on torch too).
CHROMIUM = os.environ.get("LANTERN_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"]
pytestmark = pytest.mark.skipif(
    not shutil.which(CHROMIUM), reason=f"no Chromium at {CHROMIUM} (apt-get install chromium)"
)

# tags: shown as text, not HTML. Long enough (~100 tokens) that the page renders reasoning before the
# answer arrives even on a loaded machine: a page that gets the whole reply in one read never opens
# the block (correctly), and then the open-while-thinking state cannot be observed.
THOUGHT = (
    "The user adds 2 and 2. Two is a small whole number, and adding it to itself doubles it.\n"
    "Counting on from two by two more steps gives three, then four.\nThat makes <b>4</b>."
)
ANSWER = "It is **4**."
FORCED = f"{THOUGHT}\n</think>\n\n{ANSWER}"  # the prompt already opened the block

# Records, on every change of the newest reply, whether its Thinking block is open and whether
# an answer is shown yet: the block's life while the reply streams.
WATCH = """() => {
  window.thinkStates = [];
  new MutationObserver(() => {
    const reply = [...document.querySelectorAll('.msg.assistant')].pop();
    const think = reply && reply.querySelector('details.think');
    if (think) window.thinkStates.push([think.open, !!reply.querySelector('.answer').textContent.trim()]);
  }).observe(document.querySelector('#messages'),
             {subtree: true, childList: true, attributes: true, characterData: true});
}"""


@pytest.fixture(scope="module", params=BACKENDS)
def reasoning_server(request, tiny_model_dir):
    srv = start_server(
        tiny_model_dir("llama2"),
        ServerSettings(served_model_name="tiny", ui_server=True),
        backend=request.param,
        chat_template=R1_STYLE,
    )
    assert srv.engine.backend_name == request.param
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
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    pg = context.new_page()
    yield pg
    pg.screenshot(path=str(tmp_path / f"{request.node.name}.png"), full_page=True)
    context.close()


def open_chat(page, srv, max_tokens: int) -> None:
    page.goto(srv.base_url + "/")
    page.wait_for_function("document.querySelector('#model').options.length > 0")
    page.click("#open-settings")
    page.fill("#set-temperature", "0")
    page.fill("#set-max-tokens", str(max_tokens))
    page.click("#save-settings")


def send(page, text: str) -> None:
    page.fill("#input", text)
    page.press("#input", "Enter")
    page.wait_for_selector("#send", state="visible", timeout=60_000)


def test_reasoning_folds_above_the_answer_and_is_not_sent_back(reasoning_server, page):
    sent: list[dict] = []

    def force(route):
        body = json.loads(route.request.post_data)
        sent.append(body)
        route.continue_(post_data=json.dumps({**body, "structured_outputs": {"choice": [FORCED]}}))

    page.route("**/v1/chat/completions", force)
    open_chat(page, reasoning_server, max_tokens=400)
    page.evaluate(WATCH)
    # The reply reaches the page at ~8 KB/s (Chromium's own network throttling), so it is read in
    # many pieces however fast the server streams and however busy the machine: the reasoning is on
    # the page before the answer (a page that got the whole reply in one read would rightly never
    # open the block, and CI once saw that).
    cdp = page.context.new_cdp_session(page)
    cdp.send("Network.enable")
    slow = {"offline": False, "latency": 0, "downloadThroughput": 8000, "uploadThroughput": -1}
    cdp.send("Network.emulateNetworkConditions", slow)
    send(page, "What is 2+2?")
    cdp.send("Network.emulateNetworkConditions", {**slow, "downloadThroughput": -1})
    reply = page.locator(".msg.assistant").last
    assert reply.locator("details.think summary").inner_text() == "Thinking"
    assert reply.locator("details.think .think-body").text_content() == THOUGHT  # folded: not rendered
    assert reply.locator(".answer").inner_text().strip() == "It is 4."  # Markdown: bold
    assert reply.locator(".answer strong").inner_text() == "4"
    assert reply.locator("details.think").evaluate("d => d.open") is False
    states = page.evaluate("window.thinkStates")
    # Open while only reasoning had come, folded from the first answer text on.
    assert states[0] == [True, False] and [True, False] in states and states[-1] == [False, True]
    assert all(not is_open for is_open, answered in states if answered)
    assert "<think>" not in reply.inner_text() and "</think>" not in reply.inner_text()
    # The next request carries the answer without its reasoning.
    send(page, "And 3+3?")
    assert sent[-1]["messages"][:2] == [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": ANSWER},
    ]
    stored = page.evaluate("JSON.parse(localStorage.getItem('lantern.conversations'))[0].messages[1]")
    assert (stored["content"], stored["reasoning"]) == (ANSWER, THOUGHT)
    # After a reload the block is there, folded, and opens on a click.
    page.reload()
    page.wait_for_selector(".msg.assistant details.think")
    first = page.locator(".msg.assistant").first.locator("details.think")
    assert first.evaluate("d => d.open") is False
    first.locator("summary").click()
    assert first.evaluate("d => d.open") is True
    assert first.locator(".think-body").inner_text() == THOUGHT


def test_a_reply_still_thinking_keeps_the_block_open(reasoning_server, page):
    """The model's own greedy output (no constraint): all reasoning, as the server streamed it in
    reasoning_content; no answer yet, so the block stays open and there is nothing to copy."""
    import httpx

    open_chat(page, reasoning_server, max_tokens=12)
    send(page, "Hello")
    expected = httpx.post(
        reasoning_server.base_url + "/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "Hello"}], "temperature": 0, "max_tokens": 12},
        timeout=120,
    ).json()["choices"][0]["message"]
    reply = page.locator(".msg.assistant").last
    assert expected["reasoning_content"] and reply.locator(".think-body").inner_text() == expected["reasoning_content"]
    answer = reply.locator(".answer").inner_text().strip()
    assert answer.split() == (expected["content"] or "").split()
    if not answer:
        assert reply.locator("details.think").evaluate("d => d.open") is True
        assert page.locator(".msg-actions").count() == 0
