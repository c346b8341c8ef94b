"""macOS-only details of the launcher, kept in one place."""

from __future__ import annotations

import platform
import shutil
import subprocess


def is_macos() -> bool:
    return platform.system() == "Darwin"


def copy_to_clipboard(text: str) -> bool:
    """pbcopy on macOS; on Linux the first of wl-copy, xclip, xsel that exists. False if none."""
    if is_macos():
        candidates = [["pbcopy"]]
    else:
        candidates = [["wl-copy"], ["xclip", "-selection", "clipboard"], ["xsel", "--clipboard", "--input"]]
    for cmd in candidates:
        if shutil.which(cmd[0]):
            subprocess.run(cmd, input=text.encode(), check=False, timeout=5)
            return True
    return False


def status_bar_title() -> str | None:
    """The macOS status bar shows a short title next to the icon; other trays show only the icon."""
    return "Lantern" if is_macos() else None
