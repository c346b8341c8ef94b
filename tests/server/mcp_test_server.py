"""A small stdio MCP server for the tests, written with the official SDK's MCPServer."""

from __future__ import annotations

from typing import Annotated

from mcp.server.mcpserver import MCPServer
from pydantic import Field

server = MCPServer("lantern-test")


@server.tool(description="Add two integers and return the sum as text.")
def add(a: Annotated[int, Field(ge=0, le=99)], b: Annotated[int, Field(ge=0, le=99)]) -> str:
    return f"the sum is {a + b}"


@server.tool(description="Return the secret word of the day.")
def secret_word() -> str:
    return "periwinkle-42"


@server.tool(description="Always fails.")
def broken(reason: str) -> str:
    raise ValueError(f"broken on purpose: {reason}")


# Exactly their parameters: a random-weight model under a forced-call grammar then closes the
# arguments object instead of inventing keys until max_tokens.
for _tool in server._tool_manager.list_tools():
    _tool.parameters["additionalProperties"] = False


if __name__ == "__main__":
    server.run("stdio")
