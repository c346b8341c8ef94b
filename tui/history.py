"""Saved terminal chats: one JSON file per conversation, and the screen that reopens them."""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.markup import escape
from textual.screen import ModalScreen
from textual.widgets import Label, OptionList
from textual.widgets.option_list import Option

logger = logging.getLogger(__name__)


def default_history_dir() -> Path:
    root = os.environ.get("XDG_STATE_HOME", os.path.expanduser("~/.local/state"))
    return Path(root) / "lantern" / "chats"


@dataclass
class SavedChat:
    id: str
    title: str
    updated: float
    messages: list[dict]


def new_chat_id() -> str:
    # Sortable by creation time, unique across processes.
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


class ChatStore:
    """Conversations on disk, newest first. A file that cannot be read is skipped, not fatal."""

    def __init__(self, directory: Path | None = None):
        self.directory = Path(directory) if directory else default_history_dir()

    def save(self, chat_id: str, messages: list[dict]) -> None:
        if not messages:
            return
        first = next((m["content"] for m in messages if m["role"] == "user"), "Chat")
        title = " ".join(first.split())[:60] or "Chat"
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{chat_id}.json"
        tmp = path.with_suffix(".tmp")  # written whole, then renamed: never a half-written chat
        tmp.write_text(json.dumps({"title": title, "updated": time.time(), "messages": messages}), encoding="utf-8")
        tmp.replace(path)

    def load(self, chat_id: str) -> SavedChat:
        data = json.loads((self.directory / f"{chat_id}.json").read_text(encoding="utf-8"))
        return SavedChat(chat_id, data["title"], data["updated"], data["messages"])

    def list(self) -> list[SavedChat]:
        chats = []
        for path in self.directory.glob("*.json"):
            try:
                chats.append(self.load(path.stem))
            except (OSError, ValueError, KeyError) as exc:
                logger.warning("skipping unreadable saved chat %s: %s", path, exc)
        return sorted(chats, key=lambda c: c.updated, reverse=True)

    def delete(self, chat_id: str) -> None:
        (self.directory / f"{chat_id}.json").unlink(missing_ok=True)


class HistoryScreen(ModalScreen[str | None]):
    """Pick a saved chat (Enter opens it, Delete removes it); dismisses with its id or None."""

    BINDINGS = [("escape", "cancel", "Close"), ("delete", "delete", "Delete chat")]

    def __init__(self, store: ChatStore):
        super().__init__()
        self.store = store

    def compose(self) -> ComposeResult:
        with Vertical(id="history"):
            yield Label("[b]Saved chats[/b]  (Enter opens, Delete removes, Esc closes)")
            yield OptionList(id="chats")

    def on_mount(self) -> None:
        self._fill()

    def _fill(self) -> None:
        chats = self.query_one("#chats", OptionList)
        chats.clear_options()
        saved = self.store.list()
        for chat in saved:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(chat.updated))
            turns = sum(m["role"] == "user" for m in chat.messages)
            # The title is the user's own text: escaped, so "[/b]" or "x[0]" shows as typed.
            label = f"{escape(chat.title)}  [dim]{when} · {turns} turn{'s' * (turns != 1)}[/dim]"
            chats.add_option(Option(label, id=chat.id))
        if saved:
            chats.highlighted = 0
        else:
            chats.add_option(Option("No saved chats yet", disabled=True))
        chats.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    def action_delete(self) -> None:
        chats = self.query_one("#chats", OptionList)
        if chats.highlighted is None:
            return
        chat_id = chats.get_option_at_index(chats.highlighted).id
        if chat_id:
            self.store.delete(chat_id)
            self._fill()

    def action_cancel(self) -> None:
        self.dismiss(None)
