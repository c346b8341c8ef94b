"""The settings screen: system prompt, temperature, top-p, max tokens (validated before saving)."""

from __future__ import annotations

from dataclasses import replace

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from lantern.tui.client import ChatSettings


class SettingsScreen(ModalScreen[ChatSettings | None]):
    BINDINGS = [("escape", "cancel", "Cancel")]

    def __init__(self, settings: ChatSettings):
        super().__init__()
        self.settings = settings

    def compose(self) -> ComposeResult:
        s = self.settings
        with Vertical(id="settings"):
            yield Label("[b]Settings[/b]")
            yield Label("System prompt")
            yield Input(s.system_prompt, id="system")
            yield Label("Temperature (0 = greedy)")
            yield Input(str(s.temperature), id="temperature")
            yield Label("Top-p")
            yield Input(str(s.top_p), id="top_p")
            yield Label("Max tokens")
            yield Input(str(s.max_tokens), id="max_tokens")
            yield Static("", id="settings-error")
            with Horizontal(id="settings-buttons"):
                yield Button("Save", variant="primary", id="save")
                yield Button("Cancel", id="cancel")

    def _read(self) -> ChatSettings:
        value = lambda name: self.query_one(f"#{name}", Input).value.strip()
        try:
            temperature, top_p = float(value("temperature")), float(value("top_p"))
            max_tokens = int(value("max_tokens"))
        except ValueError:
            raise ValueError("temperature and top-p must be numbers, max tokens an integer") from None
        if temperature < 0 or not 0 < top_p <= 1 or max_tokens < 1:
            raise ValueError("need temperature >= 0, 0 < top-p <= 1, max tokens >= 1")
        return replace(
            self.settings, system_prompt=value("system"), temperature=temperature, top_p=top_p, max_tokens=max_tokens
        )

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "cancel":
            self.dismiss(None)
            return
        try:
            self.dismiss(self._read())
        except ValueError as exc:
            self.query_one("#settings-error", Static).update(str(exc))

    def action_cancel(self) -> None:
        self.dismiss(None)
