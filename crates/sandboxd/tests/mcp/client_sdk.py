"""A third-party MCP client (official Python `mcp` SDK) against `sandboxd mcp --listen`.

usage: client_sdk.py URL TOKEN MODE   (MODE: legacy = initialize handshake and a session,
                                       auto = the SDK's default, stateless 2026-07-28 when offered,
                                       auto-keep = auto without sandbox_close, left to idle out)
Prints one JSON object with what it saw; the Rust test checks it.
"""

import asyncio
import json
import sys

from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


def texts(result):
    return "\n".join(c.text for c in result.content if getattr(c, "type", "") == "text")


async def main(url: str, token: str, mode: str) -> dict:
    out: dict = {}
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with http:
        transport = streamable_http_client(url, http_client=http)
        keep = mode.endswith("-keep")
        async with Client(transport, mode=mode.removesuffix("-keep")) as client:
            out["instructions"] = client.instructions or ""
            tools = await client.list_tools()
            out["tools"] = [t.name for t in tools.tools]
            extra = {}
            if "sandbox_create" in out["tools"]:
                created = await client.call_tool("sandbox_create", {})
                sid = texts(created).split()[1]
                out["sandbox_id"] = sid
                extra = {"sandbox_id": sid}
            r = await client.call_tool("bash", {"command": "echo hello-from-python; hostname", **extra})
            out["bash"] = texts(r)
            out["bash_is_error"] = bool(r.is_error)
            r = await client.call_tool("bash", {"command": "sh -c 'exit 3'", **extra})
            out["exit3"] = texts(r)
            r = await client.call_tool("read_file", {"path": "/nonexistent", **extra})
            out["missing_is_error"] = bool(r.is_error)
            out["missing"] = texts(r)
            if extra and not keep:
                r = await client.call_tool("bash", {"command": "true", "sandbox_id": "sbx-forged"})
                out["forged_is_error"] = bool(r.is_error)
                r = await client.call_tool("sandbox_close", extra)
                out["closed"] = texts(r)
    return out


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))))
