"""The MCP bridge on its own: config files as users write them, and a real stdio MCP server
(tests/server/mcp_test_server.py, built on the official SDK) started, listed and called."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from lantern.server.mcp_bridge import MCPConfigError, MCPServerEntry, MCPToolset, read_mcp_config

TEST_SERVER = str(Path(__file__).with_name("mcp_test_server.py"))


def _write(tmp_path: Path, obj: object) -> Path:
    p = tmp_path / "mcp.json"
    p.write_text(json.dumps(obj) if not isinstance(obj, str) else obj)
    return p


def test_config_reads_stdio_servers_and_skips_disabled(tmp_path):
    p = _write(
        tmp_path,
        {
            "mcpServers": {
                "calc": {"command": "python", "args": ["calc.py"], "env": {"A": "1"}, "cwd": "/tmp"},
                "off": {"command": "x", "disabled": True},
            }
        },
    )
    [entry] = read_mcp_config(p)
    assert entry == MCPServerEntry("calc", "python", ("calc.py",), (("A", "1"),), "/tmp")


@pytest.mark.parametrize(
    ("content", "names"),
    [
        ("{not json", "not valid JSON"),
        ({"servers": {}}, "mcpServers"),
        ({"mcpServers": {"web": {"url": "http://localhost:9/mcp"}}}, "mcpServers.web"),
        ({"mcpServers": {"a": {"args": ["x"]}}}, "mcpServers.a.command"),
        ({"mcpServers": {"a": {"command": "x", "args": "y"}}}, "mcpServers.a.args"),
        ({"mcpServers": {"a": {"command": "x", "env": {"K": 1}}}}, "mcpServers.a.env"),
    ],
)
def test_config_errors_name_what_is_wrong(tmp_path, content, names):
    with pytest.raises(MCPConfigError, match=names.replace(".", r"\.")):
        read_mcp_config(_write(tmp_path, content))


def test_missing_config_file_is_named(tmp_path):
    with pytest.raises(MCPConfigError, match="cannot read"):
        read_mcp_config(tmp_path / "absent.json")


def test_real_server_lists_and_runs_tools():
    async def run() -> tuple:
        tools = MCPToolset([MCPServerEntry("t", sys.executable, (TEST_SERVER,))])
        await tools.start()
        try:
            offered = tools.openai_tools()
            ok = await tools.call("add", {"a": 20, "b": 22})
            failed = await tools.call("broken", {"reason": "test"})
        finally:
            await tools.close()
        return offered, ok, failed

    offered, ok, failed = asyncio.run(asyncio.wait_for(run(), 120))
    by_name = {t["function"]["name"]: t["function"] for t in offered}
    assert set(by_name) == {"add", "secret_word", "broken"}
    assert by_name["add"]["parameters"]["required"] == ["a", "b"]
    assert ok == ("the sum is 42", False)
    assert failed[1] is True  # the tool's failure reaches the model as an error result, not an exception


def test_a_server_that_cannot_start_is_named():
    async def run() -> None:
        tools = MCPToolset([MCPServerEntry("ghost", "/nonexistent/mcp-server-binary")])
        await tools.start()

    with pytest.raises(MCPConfigError, match="'ghost'"):
        asyncio.run(asyncio.wait_for(run(), 60))


def test_same_tool_name_on_two_servers_is_prefixed():
    async def run() -> list[str]:
        entry = (sys.executable, (TEST_SERVER,))
        tools = MCPToolset([MCPServerEntry("one", *entry), MCPServerEntry("two", *entry)])
        await tools.start()
        try:
            names = list(tools.tools)
            assert (await tools.call("two__add", {"a": 1, "b": 2}))[0] == "the sum is 3"
        finally:
            await tools.close()
        return names

    names = asyncio.run(asyncio.wait_for(run(), 120))
    assert {"add", "two__add", "secret_word", "two__secret_word"} <= set(names)
