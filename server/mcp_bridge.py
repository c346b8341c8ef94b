"""MCP servers (`--mcp-config FILE`) whose tools the server offers to the model and runs itself.

The config is the common `mcpServers` JSON that Claude Desktop, Cursor and LM Studio read:
    {"mcpServers": {"files": {"command": "npx", "args": ["-y", "..."], "env": {...}, "cwd": "..."}}}
Only stdio servers are started here; an entry with a "url" (HTTP transport) is refused at start-up
with one line naming it, so a config is never half-honoured silently.

The official `mcp` SDK does the protocol. Its sessions live inside anyio task scopes, which must be
entered and left by one task, so one long-lived task owns every session (`_serve`) and callers
from request handlers only await its session methods.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

MAX_RESULT_CHARS = 64_000  # a tool's output fed back to the model is cut here (it is prompt tokens)


class MCPConfigError(ValueError):
    """An --mcp-config file that cannot be used as written."""


@dataclass(frozen=True)
class MCPServerEntry:
    name: str
    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None


@dataclass(frozen=True)
class MCPTool:
    server: str
    name: str  # as offered to the model (unique across servers)
    remote_name: str  # as the MCP server knows it
    description: str
    input_schema: dict[str, Any]

    def openai_tool(self) -> dict[str, Any]:
        """The tool as an OpenAI `tools` entry (what chat templates and tool parsers take)."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.input_schema},
        }


def read_mcp_config(path: str | Path) -> list[MCPServerEntry]:
    """The stdio servers of an `mcpServers` file; refuses what cannot be honoured, naming it."""
    p = Path(path)
    try:
        raw = json.loads(p.read_text())
    except OSError as exc:
        raise MCPConfigError(f"--mcp-config {p}: cannot read it: {exc}") from None
    except json.JSONDecodeError as exc:
        raise MCPConfigError(f"--mcp-config {p}: not valid JSON: {exc}") from None
    servers = raw.get("mcpServers") if isinstance(raw, dict) else None
    if not isinstance(servers, dict) or not servers:
        raise MCPConfigError(f'--mcp-config {p}: expected {{"mcpServers": {{"<name>": {{"command": ...}}}}}}')
    entries = []
    for name, spec in servers.items():
        where = f"--mcp-config {p}: mcpServers.{name}"
        if not isinstance(spec, dict):
            raise MCPConfigError(f"{where} must be an object")
        if spec.get("disabled") is True:
            logger.info("MCP server %s is disabled in %s; not started", name, p)
            continue
        if "url" in spec or spec.get("type") in ("http", "sse", "streamable-http"):
            raise MCPConfigError(f"{where}: only stdio servers (a command) are supported, not a URL")
        command = spec.get("command")
        if not isinstance(command, str) or not command:
            raise MCPConfigError(f"{where}.command must be a non-empty string")
        args = spec.get("args", [])
        env = spec.get("env", {})
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise MCPConfigError(f"{where}.args must be a list of strings")
        if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
            raise MCPConfigError(f"{where}.env must map names to strings")
        cwd = spec.get("cwd")
        if cwd is not None and not isinstance(cwd, str):
            raise MCPConfigError(f"{where}.cwd must be a string")
        entries.append(MCPServerEntry(name, command, tuple(args), tuple(sorted(env.items())), cwd))
    return entries


def _result_text(result: Any) -> str:
    """A CallToolResult as the text the model reads: text parts joined, structured content as JSON,
    other parts (images, resources) named rather than dropped."""
    parts = []
    for block in result.content or []:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        else:
            parts.append(f"[{kind} content omitted]")
    if not parts and getattr(result, "structured_content", None) is not None:
        parts.append(json.dumps(result.structured_content))
    text = "\n".join(parts)
    if len(text) > MAX_RESULT_CHARS:
        text = text[:MAX_RESULT_CHARS] + f"\n[... cut at {MAX_RESULT_CHARS} characters]"
    return text


class MCPToolset:
    """The tools of every configured MCP server, with their sessions kept open while serving."""

    def __init__(self, entries: list[MCPServerEntry], call_timeout: float = 120.0):
        self.entries = entries
        self.call_timeout = call_timeout
        self.tools: dict[str, MCPTool] = {}
        self._sessions: dict[str, Any] = {}
        self._ready: asyncio.Future[None] | None = None
        self._stop: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start every server and list its tools; raises (naming the server) if one fails."""
        loop = asyncio.get_running_loop()
        self._ready = loop.create_future()
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(self._serve(), name="mcp-sessions")
        await self._ready
        logger.info("MCP: %d tool(s) from %d server(s): %s", len(self.tools), len(self.entries), ", ".join(self.tools))

    async def _serve(self) -> None:
        from mcp import ClientSession, StdioServerParameters, stdio_client

        assert self._ready is not None and self._stop is not None
        try:
            async with AsyncExitStack() as stack:
                for entry in self.entries:
                    params = StdioServerParameters(
                        command=entry.command, args=list(entry.args), env=dict(entry.env) or None, cwd=entry.cwd
                    )
                    try:
                        read, write = await stack.enter_async_context(stdio_client(params, errlog=_errlog()))
                        session = await stack.enter_async_context(ClientSession(read, write))
                        await asyncio.wait_for(session.initialize(), timeout=60)
                        listed = await session.list_tools()
                    except Exception as exc:
                        why = f"MCP server {entry.name!r} ({entry.command}) failed to start: {exc}"
                        raise MCPConfigError(why) from exc
                    self._sessions[entry.name] = session
                    for tool in listed.tools:
                        self._add_tool(entry.name, tool)
                self._ready.set_result(None)
                await self._stop.wait()
        except BaseException as exc:
            if not self._ready.done():
                self._ready.set_exception(exc if isinstance(exc, Exception) else RuntimeError(str(exc)))
                return
            raise

    def _add_tool(self, server: str, tool: Any) -> None:
        name = tool.name if tool.name not in self.tools else f"{server}__{tool.name}"
        if name in self.tools:
            logger.warning("MCP: tool %s of server %s is offered twice; the second is skipped", tool.name, server)
            return
        schema = dict(tool.input_schema or {"type": "object", "properties": {}})
        self.tools[name] = MCPTool(server, name, tool.name, tool.description or "", schema)

    def openai_tools(self) -> list[dict[str, Any]]:
        return [t.openai_tool() for t in self.tools.values()]

    async def call(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        """Run tool `name`; (text for the model, whether it failed). Never raises for a tool's own
        failure: the model is told what went wrong and may try again."""
        tool = self.tools[name]
        session = self._sessions[tool.server]
        try:
            result = await asyncio.wait_for(session.call_tool(tool.remote_name, arguments), self.call_timeout)
        except TimeoutError:
            return f"tool {name} did not answer within {self.call_timeout:.0f} s", True
        except Exception as exc:  # a protocol error or a dead server: reported to the model
            logger.warning("MCP tool %s failed: %s", name, exc)
            return f"tool {name} failed: {exc}", True
        return _result_text(result), bool(getattr(result, "is_error", False))

    async def close(self) -> None:
        if self._stop is not None:
            self._stop.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, timeout=10)
            except Exception as exc:  # shutting down: a server that will not stop is only logged
                logger.warning("MCP servers did not stop cleanly: %s", exc)


def _errlog() -> Any:
    """Where MCP servers' stderr goes: ours at DEBUG, else nowhere (their logs are not ours)."""
    if logger.isEnabledFor(logging.DEBUG):
        import sys

        return sys.stderr
    return open(os.devnull, "w")  # the subprocess writes to it for its whole life
