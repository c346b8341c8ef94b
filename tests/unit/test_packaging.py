"""A non-editable install carries the files the front ends load at run time."""
from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_wheel_ships_browser_chat_and_tui_styles(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path)], check=True, timeout=300)
    [wheel] = tmp_path.glob("lantern-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    web = {p.name for p in (ROOT / "assets" / "web").iterdir()}
    assert {f"assets/web/{n}" for n in web} <= names  # server/app.py looks for ../assets/web
    assert "server/app.py" in names and "tui/chat.tcss" in names and "app/cli.py" in names
