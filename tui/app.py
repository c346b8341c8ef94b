"""`lantern chat`: a Textual terminal chat over a ChatClient (in-process engine or HTTP server)."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Awaitable, Callable

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Collapsible, Footer, Header, Input, Label, Markdown, Static

from lantern.tui.client import ChatClient, ChatError, ChatSettings
from lantern.tui.history import ChatStore, HistoryScreen, new_chat_id
from lantern.tui.settings import SettingsScreen

_THINK = re.compile(r"^\s*<think>(.*?)(?:</think>|$)(.*)$", re.S)


def split_reasoning(text: str) -> tuple[str | None, str]:
    """(<think> content or None, the visible answer): for replies saved with their reasoning
    inline, before reasoning was kept apart."""
    m = _THINK.match(text)
    return (m.group(1).strip(), m.group(2).lstrip()) if m else (None, text)


def outgoing(history: list[dict]) -> list[dict]:
    """The messages sent to the model: role and content only (reasoning is never sent back)."""
    return [{"role": m["role"], "content": m["content"]} for m in history]


class Message(Vertical):
    """One chat turn. An assistant turn shows its reasoning dim in a "Thinking" block above the
    answer: open while the model thinks, collapsed once the answer starts."""

    def __init__(self, role: str, text: str = ""):
        super().__init__(classes=f"message {role}")
        self.role, self.text, self.reasoning = role, text, ""
        self.folded = False  # folded once when the answer starts; the user may reopen it

    def compose(self) -> ComposeResult:
        yield Label("You" if self.role == "user" else "Assistant", classes="role")
        if self.role == "assistant":
            # Plain text, not Markdown: it grows every token and is only a glance at the thinking.
            with Collapsible(title="Thinking", collapsed=False, id="reasoning"):
                yield Static("", id="thoughts", markup=False)  # the model's "[b]" is text
        yield Markdown(self.text, id="body")

    def on_mount(self) -> None:
        if self.role == "assistant":
            self.query_one("#reasoning").display = False

    async def set_text(self, text: str, reasoning: str = "") -> None:
        if reasoning != self.reasoning:
            self.reasoning = reasoning
            box = self.query_one("#reasoning", Collapsible)
            box.display = bool(reasoning)
            self.query_one("#thoughts", Static).update(reasoning.strip())
        if text and self.reasoning and not self.folded:
            self.folded = True
            self.query_one("#reasoning", Collapsible).collapsed = True
        if text != self.text:
            self.text = text
            await self.query_one("#body", Markdown).update(text)


class StatsPanel(Static):
    def show(self, stats: dict) -> None:
        def fmt(value, spec):
            return "–" if value is None else format(value, spec)

        kv = stats.get("kv_usage")
        self.update(
            "[b]Live stats[/b]\n\n"
            f"tokens/s  {fmt(stats.get('tps'), '.1f')}\n"
            f"TTFT      {fmt(stats.get('ttft'), '.2f')}{' s' if stats.get('ttft') is not None else ''}\n"
            f"KV cache  {'–' if kv is None else f'{kv * 100:.0f}%'}\n"
            f"running   {fmt(stats.get('running'), '.0f')}\n"
            f"waiting   {fmt(stats.get('waiting'), '.0f')}"
        )


class ChatApp(App):
    CSS_PATH = "chat.tcss"
    TITLE = "Lantern"
    BINDINGS = [
        Binding("escape", "stop", "Stop"),
        Binding("ctrl+n", "new_chat", "New chat"),
        Binding("ctrl+o", "history", "Saved chats"),
        Binding("ctrl+s", "settings", "Settings"),
        Binding("ctrl+y", "copy_last", "Copy reply"),
        Binding("ctrl+q", "quit", "Quit"),
    ]

    def __init__(
        self,
        client: ChatClient | None = None,
        settings: ChatSettings | None = None,
        stats_interval: float = 1.0,
        connect: Callable[[], Awaitable[ChatClient]] | None = None,
        store: ChatStore | None = None,
    ):
        """Give a ready `client`, or `connect`: the app opens at once, shows "Loading" while it
        runs (loading a model takes a while) and shows its failure in the app. With a `store`,
        each conversation is saved after every reply and can be reopened (Ctrl+O)."""
        super().__init__()
        if (client is None) == (connect is None):
            raise ValueError("give exactly one of client and connect")
        self.client = client
        self.connect = connect
        self.settings = settings or ChatSettings()
        self.history: list[dict] = []
        self.store = store
        self.chat_id = new_chat_id()
        self.stats: dict = {}
        self.stats_interval = stats_interval
        self.generating = False

    def compose(self) -> ComposeResult:
        # Kept as attributes: queries resolve against the active screen, which may be a modal.
        self.log_view = VerticalScroll(id="log")
        self.stats_panel = StatsPanel(id="stats")
        self.error_box = Static("", id="error")
        yield Header()
        with Horizontal():
            yield self.log_view
            yield self.stats_panel
        yield self.error_box
        yield Input(placeholder="Message (Enter to send)", id="prompt")
        yield Footer()

    def on_mount(self) -> None:
        self.error_box.display = False
        self.stats_panel.show(self.stats)
        self.set_interval(self.stats_interval, self.refresh_stats)
        self.query_one("#prompt", Input).focus()
        if self.client is not None:
            self.sub_title = self.client.model_name
        else:
            self.sub_title = "Loading…"
            self.open_client()

    @work(exclusive=True, group="connect")
    async def open_client(self) -> None:
        try:
            self.client = await self.connect()
        except (ChatError, ValueError, RuntimeError, OSError) as exc:
            self.sub_title = "not loaded"
            self.show_error(f"could not start the chat: {exc}")
            return
        self.sub_title = self.client.model_name

    async def refresh_stats(self) -> None:
        if self.client is None:
            return
        try:
            self.stats.update(await self.client.stats())
        except ChatError as exc:  # the server went away: say so, keep polling
            self.show_error(str(exc))
        self.stats_panel.show(self.stats)

    def show_error(self, message: str) -> None:
        self.error_box.update(f"[b]Error:[/b] {message}")
        self.error_box.display = bool(message)

    async def on_input_submitted(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        if not text or self.generating:
            return
        if self.client is None:
            loading = any(w.group == "connect" and not w.is_finished for w in self.workers)
            self.notify("The model is still loading" if loading else "No model loaded", severity="warning")
            return
        event.input.value = ""
        self.show_error("")
        self.history.append({"role": "user", "content": text})
        log = self.log_view
        asked = Message("user", text)
        await log.mount(asked)
        reply = Message("assistant")
        await log.mount(reply)
        log.scroll_end(animate=False)
        self.generate(asked, reply)

    @work(exclusive=True, group="generate")
    async def generate(self, asked: Message, reply: Message) -> None:
        # New chat / opening a saved one swaps in a fresh list: a late reply lands in the old one.
        history, chat_id = self.history, self.chat_id
        messages = outgoing(history)
        if self.settings.system_prompt:
            messages.insert(0, {"role": "system", "content": self.settings.system_prompt})
        self.generating = True
        text, thoughts, pieces, start, first, failed = "", "", 0, time.monotonic(), None, False
        try:
            stream = self.client.stream_chat(messages, self.settings)
            async with contextlib.aclosing(stream):
                async for delta in stream:
                    now = time.monotonic()
                    if first is None:
                        first = now
                        self.stats["ttft"] = now - start
                    pieces += 1
                    text, thoughts = text + delta.content, thoughts + delta.reasoning
                    if now > first:
                        self.stats["tps"] = (pieces - 1) / (now - first)
                    await reply.set_text(text, thoughts)
                    self.log_view.scroll_end(animate=False)
        except ChatError as exc:
            self.show_error(str(exc))
            if not text and not thoughts:
                # Nothing came back (e.g. the prompt is too long): take the turn out of the
                # conversation and give the prompt back to edit, so roles keep alternating.
                failed = True
                history.pop()
                await asked.remove()
                await reply.remove()
                self.query_one("#prompt", Input).value = asked.text
        finally:
            self.generating = False
            self.stats_panel.show(self.stats)
            if not failed:  # a stopped reply is kept as far as it got
                # The reasoning is kept (shown when the chat is reopened), never sent: see outgoing().
                turn = {"role": "assistant", "content": text}
                history.append(turn | {"reasoning_content": thoughts} if thoughts else turn)
                self.save_chat(chat_id, history)

    def save_chat(self, chat_id: str, history: list[dict]) -> None:
        if self.store is None:
            return
        try:
            self.store.save(chat_id, history)
        except OSError as exc:  # a full or read-only disk must not end the chat
            self.notify(f"Could not save the chat: {exc}", severity="warning")

    def action_stop(self) -> None:
        self.workers.cancel_group(self, "generate")

    async def action_new_chat(self) -> None:
        self.action_stop()
        self.history, self.chat_id = [], new_chat_id()
        await self.log_view.remove_children()
        self.show_error("")

    def action_history(self) -> None:
        if self.store is None:
            self.notify("Saved chats are off", severity="warning")
            return

        async def open_chat(chat_id: str | None) -> None:
            if chat_id is None:
                return
            try:
                chat = self.store.load(chat_id)
            except (OSError, ValueError, KeyError) as exc:
                self.show_error(f"could not open the saved chat: {exc}")
                return
            await self.action_new_chat()
            self.history, self.chat_id = list(chat.messages), chat.id
            for m in chat.messages:
                message = Message(m["role"])
                await self.log_view.mount(message)
                thoughts, answer = m.get("reasoning_content"), m["content"]
                if thoughts is None and m["role"] == "assistant":  # saved with <think> inline
                    thoughts, answer = split_reasoning(answer)
                await message.set_text(answer, thoughts or "")
            self.log_view.scroll_end(animate=False)

        self.push_screen(HistoryScreen(self.store), open_chat)

    def action_settings(self) -> None:
        def apply(result: ChatSettings | None) -> None:
            if result is not None:
                self.settings = result

        self.push_screen(SettingsScreen(self.settings), apply)

    def action_copy_last(self) -> None:
        replies = [m["content"] for m in self.history if m["role"] == "assistant"]
        if replies:
            self.copy_to_clipboard(replies[-1])
            self.notify("Copied the last reply")

    async def on_unmount(self) -> None:
        if self.client is not None:
            await self.client.close()
