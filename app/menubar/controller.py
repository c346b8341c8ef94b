"""The menu-bar launcher's brain: a supervised `lantern serve` child process, watched via /health.

No GUI here, so the same controller serves the macOS status bar, a Linux tray, and tests.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import httpx

from lantern.app.models.default_model import cache_dir

logger = logging.getLogger(__name__)

STOPPED, LOADING, SERVING, FAILED = "stopped", "loading", "serving", "failed"
MAX_RECENT = 8


def model_flag(model: str) -> list[str]:
    """The serve flag for a model: --f FILE.gguf, --w DIR, or --m HUB_ID."""
    path = Path(model).expanduser()
    if path.suffix.lower() == ".gguf":
        return ["--f", str(path)]
    if path.is_dir():
        return ["--w", str(path)]
    return ["--m", model]


class ServerController:
    def __init__(
        self,
        port: int = 2000,
        host: str = "127.0.0.1",
        extra_args: list[str] | None = None,
        state_dir: Path | None = None,
    ):
        self.port, self.host = port, host
        self.extra_args = list(extra_args or [])
        self.state_dir = state_dir or cache_dir()
        self.proc: subprocess.Popen | None = None
        self.model: str | None = None
        self.error: str | None = None
        self._log_path = self.state_dir / "menubar-server.log"

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def api_url(self) -> str:
        return f"{self.base_url}/v1"

    # ---- lifecycle -----------------------------------------------------------------------
    def start(self, model: str | None = None) -> None:
        """Start serving `model` (None: the default model); restarts if already running."""
        self.stop()
        self.model, self.error = model, None
        cmd = [sys.executable, "-m", "lantern", "serve", "--p", str(self.port), "--h", self.host, "--ui-server"]
        cmd += (model_flag(model) if model else []) + self.extra_args
        self.state_dir.mkdir(parents=True, exist_ok=True)
        log = open(self._log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        if model:
            self.remember(model)
        logger.info("started server (pid %d): %s", self.proc.pid, " ".join(cmd))

    def stop(self, timeout: float = 20.0) -> None:
        """Stop the child cleanly (SIGTERM lets uvicorn finish; SIGKILL after the timeout)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def status(self) -> str:
        if self.proc is None:
            return STOPPED
        if self.proc.poll() is not None:
            self.error = self._last_log_line() or f"server exited with code {self.proc.returncode}"
            return FAILED
        try:
            ok = httpx.get(f"{self.base_url}/health", timeout=1.0).status_code == 200
        except httpx.HTTPError:
            ok = False
        return SERVING if ok else LOADING

    def wait(self, timeout: float = 300.0, poll: float = 0.5) -> str:
        """Block until the server serves or fails (or the timeout passes); returns the status."""
        deadline = time.monotonic() + timeout
        while True:
            status = self.status()
            if status in (SERVING, FAILED, STOPPED) or time.monotonic() > deadline:
                return status
            time.sleep(poll)

    def status_text(self) -> str:
        status = self.status()
        name = Path(self.model).name if self.model else "default model"
        return {
            STOPPED: "Stopped",
            LOADING: f"Loading {name}…",
            SERVING: f"Serving {name} on port {self.port}",
            FAILED: f"Failed: {self.error}",
        }[status]

    def _last_log_line(self) -> str | None:
        try:
            lines = [ln for ln in self._log_path.read_text().splitlines() if ln.strip()]
        except OSError:
            return None
        return lines[-1] if lines else None

    # ---- models --------------------------------------------------------------------------
    @property
    def _recent_file(self) -> Path:
        return self.state_dir / "recent-models.json"

    def recent(self) -> list[str]:
        try:
            return json.loads(self._recent_file.read_text())
        except (OSError, ValueError):
            return []

    def remember(self, model: str) -> None:
        items = [model] + [m for m in self.recent() if m != model]
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._recent_file.write_text(json.dumps(items[:MAX_RECENT]))

    def local_models(self) -> list[str]:
        """Recent models, GGUF files in Lantern's cache, and models in the Hugging Face cache."""
        found = list(self.recent())
        for gguf in sorted((self.state_dir / "models").glob("*.gguf")):
            found.append(str(gguf))
        try:
            from huggingface_hub import scan_cache_dir

            for repo in scan_cache_dir().repos:
                if repo.repo_type == "model":
                    found.append(repo.repo_id)
        except Exception:  # no HF cache yet
            pass
        return list(dict.fromkeys(found))
