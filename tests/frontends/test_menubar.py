"""The menu-bar launcher: its controller against a real `lantern serve` child process, and the
tray icon itself (pystray's GTK status icon) docked in a real system tray (trayer) under Xvfb:
its menu opened with a right click and driven with the keyboard through xdotool."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time

import httpx
import pytest

from lantern.app.menubar.controller import FAILED, SERVING, STOPPED, ServerController
from tests.server.conftest import free_port

pytestmark = pytest.mark.slow

# The backend a user of this platform gets (torch on a Linux CPU, MLX on Apple Silicon): the
# launcher is tested on the path it ships with.
ENGINE_ARGS = ["--backend", "auto", "--dtype", "float32", "--mem", "16", "--log", "warning"]


@pytest.fixture(autouse=True)
def _needs_a_backend():
    from lantern.backends import pick_backend

    try:
        pick_backend("auto")
    except RuntimeError as exc:
        pytest.skip(str(exc))


def test_controller_starts_serves_and_stops(tiny_model_dir, tmp_path):
    ctl = ServerController(port=free_port(), extra_args=ENGINE_ARGS, state_dir=tmp_path)
    assert ctl.status() == STOPPED and ctl.status_text() == "Stopped"
    model = tiny_model_dir("llama2")
    ctl.start(model)
    assert ctl.wait(timeout=240) == SERVING, (tmp_path / "menubar-server.log").read_text()
    assert ctl.status_text() == f"Serving {os.path.basename(model)} on port {ctl.port}"
    assert httpx.get(f"{ctl.api_url}/models").json()["data"][0]["id"] == os.path.basename(model)
    assert httpx.get(ctl.base_url + "/").status_code == 200  # started with the browser chat
    assert ctl.local_models()[0] == model  # remembered as the most recent model
    pid = ctl.proc.pid
    ctl.stop()
    assert ctl.status() == STOPPED
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    ctl.start(str(tmp_path / "no-such-model"))
    assert ctl.wait(timeout=120) == FAILED
    assert "not a model folder" in ctl.status_text()


def _gtk_available() -> bool:
    try:
        import gi

        gi.require_version("Gtk", "3.0")
        return True
    except (ImportError, ValueError):
        return False


@pytest.fixture
def x_display():
    """Xvfb with a system tray (trayer) docked in it and a D-Bus session bus (GTK wants one)."""
    if not (
        shutil.which("Xvfb") and shutil.which("trayer") and shutil.which("xdotool") and shutil.which("dbus-daemon")
    ):
        pytest.skip("needs Xvfb, trayer, xdotool and dbus (apt-get install xvfb trayer xdotool dbus)")
    if not _gtk_available():
        pytest.skip(
            "needs PyGObject with GTK 3 (apt-get install gir1.2-gtk-3.0 libgirepository1.0-dev "
            "libcairo2-dev; pip install 'PyGObject<3.51')"
        )
    # -displayfd: Xvfb picks a free display number and reports it once it is ready.
    xvfb = subprocess.Popen(
        ["Xvfb", "-displayfd", "1", "-screen", "0", "800x600x24", "-nolisten", "tcp"], stdout=subprocess.PIPE, text=True
    )
    display = ":" + xvfb.stdout.readline().strip()
    # Own session: the bus and what it activates must not share the test's process group.
    bus = subprocess.Popen(
        ["dbus-daemon", "--session", "--nofork", "--print-address=1"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    bus_address = bus.stdout.readline().strip()
    env = dict(os.environ, DISPLAY=display, DBUS_SESSION_BUS_ADDRESS=bus_address)
    time.sleep(1.0)
    tray = subprocess.Popen(
        ["trayer", "--edge", "top", "--align", "right", "--widthtype", "pixel", "--width", "200", "--height", "32"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.5)
    saved = {k: os.environ.get(k) for k in ("DISPLAY", "DBUS_SESSION_BUS_ADDRESS", "NO_AT_BRIDGE")}
    # NO_AT_BRIDGE: GTK would otherwise start an accessibility bus on the session bus.
    os.environ.update(DISPLAY=display, DBUS_SESSION_BUS_ADDRESS=bus_address, NO_AT_BRIDGE="1")
    yield env
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    for proc in (tray, bus, xvfb):
        proc.terminate()


def on_gtk_thread(fn):
    """Run fn on the GTK main loop (the tray's thread) and return its result."""
    from gi.repository import GLib

    box, done = [], threading.Event()
    GLib.idle_add(lambda: (box.append(fn()), done.set(), False)[-1])
    assert done.wait(10), "GTK main loop did not answer"
    return box[0]


def shown_menu():
    """The tray's open top-level menu, found among GTK's toplevel windows (not through pystray's
    handle: pystray rebuilds its menu object on every update, e.g. when the server comes up, so
    the handle may be a newer, unshown menu than the one on screen). Call on the GTK thread."""
    from gi.repository import Gtk

    for window in Gtk.Window.list_toplevels():
        child = window.get_child()
        if window.get_visible() and isinstance(child, Gtk.Menu) and child.get_attach_widget() is None:
            return child
    return None


def open_menu(tray, icon_window: str, env: dict) -> list[tuple[str, bool]]:
    """Right-click the docked icon like a user; return the open menu's (label, enabled) rows."""
    for attempt in range(3):  # a click may land while the tray is still settling; a user clicks again
        subprocess.run(["xdotool", "mousemove", "--window", icon_window, "8", "8", "click", "3"], env=env, check=True)
        try:
            wait_until(lambda: on_gtk_thread(shown_menu) is not None, "the tray menu did not open", timeout=5.0)
            break
        except AssertionError:
            if attempt == 2:
                raise
    rows = on_gtk_thread(lambda: [(c.get_label(), c.get_sensitive()) for c in shown_menu().get_children()])
    return [((label or "").replace("<b>", "").replace("</b>", ""), enabled) for label, enabled in rows]


def choose(tray, key: str, label: str, env: dict) -> None:
    """Move through the open menu with a key until `label` is selected, then press Return."""

    def selected() -> str | None:
        menu = shown_menu()
        item = menu.get_selected_item() if menu else None
        return item.get_label().replace("<b>", "").replace("</b>", "") if item else None

    subprocess.run(["xdotool", "key", key], env=env, check=True)
    wait_until(lambda: on_gtk_thread(selected) == label, f"{key} did not select {label}")
    subprocess.run(["xdotool", "key", "Return"], env=env, check=True)


def close_menu(tray, env: dict) -> None:
    subprocess.run(["xdotool", "key", "Escape"], env=env, check=True)
    wait_until(lambda: on_gtk_thread(shown_menu) is None, "the menu did not close")


def wait_until(predicate, message: str, timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.1)):
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(message)


def docked_icon_window(env: dict) -> str:
    """Our process's one visible X window: the icon docked in trayer."""
    found: list[str] = []

    def one_window() -> bool:
        found[:] = subprocess.run(
            ["xdotool", "search", "--onlyvisible", "--pid", str(os.getpid())], env=env, capture_output=True, text=True
        ).stdout.split()
        return len(found) == 1

    wait_until(one_window, f"expected one docked icon window, found {found}")
    return found[0]


def test_tray_menu_opens_starts_the_server_and_quits(tiny_model_dir, tmp_path, x_display):
    from lantern.app.menubar.tray import Tray  # imports pystray, which needs the display

    ctl = ServerController(port=free_port(), extra_args=ENGINE_ARGS, state_dir=tmp_path)
    model = tiny_model_dir("llama2")
    ctl.remember(model)
    opened, copied = [], []
    tray = Tray(ctl, opener=opened.append, copier=lambda text: copied.append(text) or True)
    assert type(tray.icon).__module__ == "pystray._gtk"  # a GTK status icon: a tray with real menus
    thread = threading.Thread(target=tray.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: tray.icon.visible, "the tray icon did not show")
        wait_until(lambda: on_gtk_thread(tray.icon._status_icon.is_embedded), "the icon did not dock in the tray")
        icon_window = docked_icon_window(x_display)
        rows = open_menu(tray, icon_window, x_display)
        labels = [label for label, _ in rows if label]  # separators have no label
        assert labels == ["Stopped", "Start", "Stop", "Model", "Open browser chat", "Copy API URL", "Quit"]
        assert dict(rows)["Stop"] is False and dict(rows)["Open browser chat"] is False
        assert tray.item("Model").submenu.items[0].checked
        # Keyboard in the open menu: Down selects the first enabled item (Start), Return runs it.
        choose(tray, "Down", "Start", x_display)
        assert ctl.wait(timeout=240) == SERVING, (tmp_path / "menubar-server.log").read_text()
        for _ in range(50):  # the menu is rebuilt once the server answers /health
            rows = open_menu(tray, icon_window, x_display)
            if rows[0][0].startswith("Serving"):
                break
            close_menu(tray, x_display)
            time.sleep(0.2)
        assert rows[0][0] == f"Serving {os.path.basename(model)} on port {ctl.port}"
        assert dict(rows)["Open browser chat"] is True and dict(rows)["Stop"] is True
        close_menu(tray, x_display)
        tray.item("Copy API URL")(tray.icon)
        assert copied == [ctl.api_url]
        tray.item("Open browser chat")(tray.icon)
        assert opened == [ctl.base_url + "/"]
        assert "Lantern chat" in httpx.get(opened[0]).text
        assert tray.icon.title.endswith(f"Serving {os.path.basename(model)} on port {ctl.port}")
        # The server dies under the tray: it notices by itself and offers Start again.
        ctl.proc.kill()
        wait_until(lambda: "Failed" in tray.icon.title, "the tray did not notice the crash")
        rows = open_menu(tray, icon_window, x_display)
        assert rows[0][0].startswith("Failed") and dict(rows)["Start"] is True and dict(rows)["Stop"] is False
        choose(tray, "Down", "Start", x_display)
        assert ctl.wait(timeout=240) == SERVING, (tmp_path / "menubar-server.log").read_text()
        wait_until(lambda: "Serving" in tray.icon.title, "the tray did not see the restart")
        pid = ctl.proc.pid
        open_menu(tray, icon_window, x_display)
        choose(tray, "Up", "Quit", x_display)  # Up from the top wraps to the last item
        thread.join(timeout=30)
        assert not thread.is_alive()
        assert ctl.status() == STOPPED
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    finally:
        ctl.stop()
        if thread.is_alive():  # GTK exits the process if its X server goes away under it
            tray.quit()
            thread.join(timeout=30)
