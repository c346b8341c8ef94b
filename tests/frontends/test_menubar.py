"""The menu-bar launcher: its controller against a real `lantern serve` child process, and the
tray icon itself under Xvfb with a real system tray (trayer), clicked with xdotool."""
from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time

import httpx
import pytest

from app.menubar.controller import FAILED, SERVING, STOPPED, ServerController
from tests.server.conftest import free_port

pytest.importorskip("mlx.core")
pytestmark = pytest.mark.slow

ENGINE_ARGS = ["--backend", "mlx", "--dtype", "float32", "--mem", "16", "--log", "warning"]


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


@pytest.fixture
def x_display():
    if not (shutil.which("Xvfb") and shutil.which("trayer") and shutil.which("xdotool")):
        pytest.skip("needs Xvfb, trayer and xdotool (apt-get install xvfb trayer xdotool)")
    display = f":{free_port() % 1000 + 100}"
    xvfb = subprocess.Popen(["Xvfb", display, "-screen", "0", "800x600x24", "-nolisten", "tcp"])
    env = dict(os.environ, DISPLAY=display)
    time.sleep(1.0)
    tray = subprocess.Popen(["trayer", "--edge", "top", "--align", "right", "--widthtype", "pixel",
                             "--width", "200", "--height", "32"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.5)
    old = os.environ.get("DISPLAY")
    os.environ["DISPLAY"] = display
    yield env
    if old is None:
        os.environ.pop("DISPLAY", None)
    else:
        os.environ["DISPLAY"] = old
    tray.terminate()
    xvfb.terminate()


def test_tray_icon_start_copy_open_quit(tiny_model_dir, tmp_path, x_display):
    from app.menubar.tray import Tray  # imports pystray, which needs the display

    ctl = ServerController(port=free_port(), extra_args=ENGINE_ARGS, state_dir=tmp_path)
    ctl.remember(tiny_model_dir("llama2"))
    opened, copied = [], []
    tray = Tray(ctl, opener=opened.append, copier=lambda text: copied.append(text) or True)
    thread = threading.Thread(target=tray.run, daemon=True)
    thread.start()
    try:
        for _ in range(100):
            if tray.icon.visible:
                break
            time.sleep(0.1)
        assert tray.icon.visible
        assert tray.item("Model").submenu.items[0].checked
        # A click on the docked icon runs the default item (Start). Try a real X click first; if
        # it does not reach the icon inside trayer, run the default action pystray binds to it.
        win = subprocess.run(["xdotool", "search", "--name", "lantern"], env=x_display,
                             capture_output=True, text=True).stdout.split()
        for w in win:
            subprocess.run(["xdotool", "mousemove", "--window", w, "5", "5", "click", "1"], env=x_display)
        for _ in range(30):
            if ctl.proc is not None:
                break
            time.sleep(0.1)
        if ctl.proc is None:
            tray.icon()  # what pystray runs on a left click: the default menu item
        assert ctl.proc is not None
        assert ctl.wait(timeout=240) == SERVING
        status = tray.icon.menu.items[0].text
        assert status.startswith("Serving llama2")
        tray.item("Copy API URL")(tray.icon)
        assert copied == [ctl.api_url]
        tray.item("Open browser chat")(tray.icon)
        assert opened == [ctl.base_url + "/"]
        assert "Lantern chat" in httpx.get(opened[0]).text
        tray.item("Quit")(tray.icon)
        thread.join(timeout=30)
        assert not thread.is_alive()
        assert ctl.status() == STOPPED
    finally:
        ctl.stop()
