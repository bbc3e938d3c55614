"""A tiny third-party MCP server (official Python `mcp` SDK, stdio or legacy SSE) for sandboxd's client tests.

Tools: echo, image (a 1x1 PNG), fail (a tool error), crash (the process dies mid-call),
grow (adds a tool and sends notifications/tools/list_changed).
"""

import os
import sys

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.utilities.types import Image

server = MCPServer(
    name="pyserver",
    instructions="pyserver echoes text. Use echo for greetings.",
)

PNG_1X1 = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d4944415478da63f8cfc0f01f0005000201a5f6a1"
    "5f0000000049454e44ae426082"
)


@server.tool(name="echo.text", description="Echo the text back, prefixed with 'echo: '.")
def echo(text: str) -> str:
    return "echo: " + text


@server.tool(description="Return the environment variable names this server sees, comma separated.")
def env_names() -> str:
    return ",".join(sorted(os.environ))


@server.tool(description="Return a tiny PNG image.")
def image() -> Image:
    return Image(data=PNG_1X1, format="png")


@server.tool(description="Always fails with a readable message.")
def fail() -> str:
    raise ToolError("this tool always fails")


@server.tool(description="Kills this server process in the middle of the call.")
def crash() -> str:
    sys.stderr.write("pyserver: crashing on purpose\n")
    sys.stderr.flush()
    os._exit(3)


def extra(x: int) -> str:
    return f"extra {x}"


@server.tool(description="Adds the tool 'extra' and announces the change.")
async def grow(ctx: Context) -> str:
    server.add_tool(extra, name="extra", description="A tool added at run time.")
    await ctx.session.send_tool_list_changed()
    return "grew"


if __name__ == "__main__":
    # `--sse PORT`: the legacy HTTP+SSE transport on loopback (tests/mcp_sse.rs); else stdio.
    if len(sys.argv) == 3 and sys.argv[1] == "--sse":
        server.run("sse", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")
