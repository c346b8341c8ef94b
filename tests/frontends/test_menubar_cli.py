"""`lantern menubar` where no tray can be shown: one line naming the cause, exit status 1, no
traceback (it printed pystray's raw ImportError before). No GUI and no model needed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lantern.app.menubar.tray import TrayUnavailableError, check_graphical_session

ROOT = Path(__file__).resolve().parents[2]


def run_menubar(**env_changes: str | None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    for key, value in env_changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return subprocess.run(
        [sys.executable, "-m", "lantern", "menubar"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def error_lines(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.strip()]


@pytest.mark.skipif(sys.platform == "darwin", reason="macOS always has its status bar")
def test_menubar_without_a_display_says_so_in_one_line():
    result = run_menubar(DISPLAY=None, WAYLAND_DISPLAY=None)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr + result.stdout
    [line] = error_lines(result)
    assert "needs a graphical session" in line and "DISPLAY" in line and "WAYLAND_DISPLAY" in line


def _free_display() -> str:
    """A display number with no X server behind it (no socket; TCP port 6000+n is refused)."""
    for n in range(4242, 4300):
        if not Path(f"/tmp/.X11-unix/X{n}").exists() and not Path(f"/tmp/.X{n}-lock").exists():
            return f":{n}"
    pytest.skip("no free X display number")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="X11 displays are a Linux matter here")
@pytest.mark.parametrize("backend", [None, "xorg"])
def test_menubar_with_an_unreachable_display_says_so_in_one_line(backend):
    # Default backend choice (GTK where PyGObject is installed) and plain X11 (python-xlib) fail
    # differently inside pystray's import; both end as one line naming the display.
    display = _free_display()
    result = run_menubar(DISPLAY=display, WAYLAND_DISPLAY=None, PYSTRAY_BACKEND=backend)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr + result.stdout
    [line] = error_lines(result)
    assert f"cannot show a tray icon on display '{display}'" in line


def test_graphical_session_check():
    with pytest.raises(TrayUnavailableError, match="needs a graphical session"):
        check_graphical_session({}, "linux")
    with pytest.raises(TrayUnavailableError):
        check_graphical_session({"DISPLAY": ""}, "freebsd14")
    check_graphical_session({"DISPLAY": ":0"}, "linux")
    check_graphical_session({"WAYLAND_DISPLAY": "wayland-0"}, "linux")
    check_graphical_session({}, "darwin")
