"""The tray / status-bar icon (pystray): status, Start/Stop, model choice, browser chat, API URL, Quit."""

from __future__ import annotations

import logging
import os
import sys
import threading
import webbrowser
from collections.abc import Callable, Mapping
from pathlib import Path

from lantern.app.menubar.controller import FAILED, SERVING, STOPPED, ServerController
from lantern.app.menubar.macos import copy_to_clipboard, status_bar_title

logger = logging.getLogger(__name__)


def icon_image(size: int = 64):
    """A small lantern drawn at start-up (no image files to ship)."""
    from PIL import Image, ImageDraw

    img = Image.new("RGBA", (size, size), (0, 0, 0, 0))
    d = ImageDraw.Draw(img)
    s = size / 64
    d.rectangle([26 * s, 4 * s, 38 * s, 10 * s], fill=(60, 60, 60, 255))
    d.rounded_rectangle(
        [16 * s, 10 * s, 48 * s, 54 * s],
        radius=8 * s,
        fill=(240, 180, 41, 255),
        outline=(60, 60, 60, 255),
        width=max(1, int(3 * s)),
    )
    d.ellipse([24 * s, 22 * s, 40 * s, 42 * s], fill=(255, 240, 200, 255))
    d.rectangle([20 * s, 54 * s, 44 * s, 60 * s], fill=(60, 60, 60, 255))
    return img


def linux_tray_backend() -> str:
    """The pystray backend for this Linux desktop: AppIndicator, else a GTK status icon (both
    have real menus), else plain X11 (a click runs the default item; no menu).

    pystray tries them in that order itself, but a PyGObject without the AppIndicator typelib
    raises ValueError rather than ImportError, which ends its search with a crash."""
    try:
        import gi
    except ImportError:
        return "xorg"
    for namespace in ("AyatanaAppIndicator3", "AppIndicator3"):
        try:
            gi.require_version(namespace, "0.1")
            return "appindicator"
        except ValueError:
            pass
    try:
        gi.require_version("Gtk", "3.0")
        return "gtk"
    except ValueError:
        return "xorg"


class TrayUnavailableError(RuntimeError):
    """No tray icon can be shown here (no graphical session, or no tray library works); the
    message is one line for the user, so `lantern menubar` ends with it instead of a traceback."""


def check_graphical_session(environ: Mapping[str, str] = os.environ, platform: str = sys.platform) -> None:
    """On Linux (and other X11/Wayland systems) a tray needs a display; macOS and Windows always
    have their status bar."""
    if platform == "darwin" or platform.startswith("win"):
        return
    if not (environ.get("DISPLAY") or environ.get("WAYLAND_DISPLAY")):
        raise TrayUnavailableError(
            "lantern menubar needs a graphical session (neither DISPLAY nor WAYLAND_DISPLAY is set); "
            "run it from a desktop session, or use `lantern serve` here"
        )


def _import_pystray():
    check_graphical_session()
    if sys.platform.startswith("linux"):
        os.environ.setdefault("PYSTRAY_BACKEND", linux_tray_backend())
    try:
        import pystray
    except Exception as exc:
        # pystray picks its backend while it is imported: an X server that refuses the connection
        # (Xlib's DisplayConnectionError) or a GTK that cannot start (ImportError) surface here.
        logger.debug("pystray failed to import", exc_info=True)
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        display = os.environ.get("WAYLAND_DISPLAY") or os.environ.get("DISPLAY")
        raise TrayUnavailableError(
            f"lantern menubar cannot show a tray icon on display {display!r} (is it running?): {reason}"
        ) from None
    return pystray


class Tray:
    def __init__(
        self,
        controller: ServerController,
        opener: Callable[[str], object] = webbrowser.open,
        copier: Callable[[str], bool] = copy_to_clipboard,
    ):
        pystray = _import_pystray()
        self.pystray = pystray
        self.controller = controller
        self.opener, self.copier = opener, copier
        self._stopped = threading.Event()
        models = controller.local_models()
        self.selected: str | None = models[0] if models else None
        self.icon = pystray.Icon("lantern", icon_image(), title=status_bar_title() or "Lantern", menu=self.menu(models))

    def menu(self, models: list[str]):
        Item, Menu = self.pystray.MenuItem, self.pystray.Menu
        c = self.controller

        def choose(model):
            return lambda icon, item: setattr(self, "selected", model)

        model_items = [
            Item(Path(m).name or m, choose(m), checked=lambda item, m=m: self.selected == m, radio=True) for m in models
        ] or [Item("Default model", None, enabled=False)]
        return Menu(
            Item(lambda item: c.status_text(), None, enabled=False),
            Menu.SEPARATOR,
            # The default item is what a click does where trays have no menu (plain X11).
            Item("Start", self.start, enabled=lambda item: c.status() in (STOPPED, FAILED), default=True),
            Item("Stop", self.stop, enabled=lambda item: c.status() not in (STOPPED, FAILED)),
            Item("Model", Menu(*model_items)),
            Menu.SEPARATOR,
            Item("Open browser chat", self.open_chat, enabled=lambda item: c.status() == SERVING),
            Item("Copy API URL", self.copy_url),
            Menu.SEPARATOR,
            Item("Quit", self.quit),
        )

    def item(self, text: str):
        """The menu item with this text (for scripting and tests)."""
        for entry in self.icon.menu.items:
            if entry.text == text:
                return entry
        raise KeyError(text)

    # ---- actions (pystray calls them with (icon, item)) ----------------------------------
    def start(self, icon=None, item=None) -> None:
        self.controller.start(self.selected)

    def stop(self, icon=None, item=None) -> None:
        self.controller.stop()
        self.icon.update_menu()

    def open_chat(self, icon=None, item=None) -> None:
        self.opener(self.controller.base_url + "/")

    def copy_url(self, icon=None, item=None) -> None:
        if not self.copier(self.controller.api_url) and self.icon.HAS_NOTIFICATION:
            self.icon.notify(self.controller.api_url, "API URL")

    def quit(self, icon=None, item=None) -> None:
        self._quitting = True
        self.controller.stop()
        self.icon.stop()

    def watch(self, interval: float = 1.0) -> None:
        """Follow the server's status (up, loading, crashed) and rebuild the menu and the icon's
        title when it changes: the menu is only evaluated when it is built."""
        last = None
        while not self._stopped.wait(interval):
            text = self.controller.status_text()
            if text != last:
                last = text
                self.icon.title = f"{status_bar_title() or 'Lantern'}: {text}"
                self.icon.update_menu()

    def run(self) -> None:
        self._quitting = False
        threading.Thread(target=self.watch, name="lantern-tray-watch", daemon=True).start()
        try:
            self.icon.run()
        except Exception as exc:
            # pystray's GTK backend closes its last notification on the way out and raises where
            # the desktop has no notification service; after Quit that is no error of ours.
            if not self._quitting:
                raise
            logger.debug("tray shut down with: %s", exc)
        finally:
            self._stopped.set()
