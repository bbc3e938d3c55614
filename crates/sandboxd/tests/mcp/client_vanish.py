"""The official Python `mcp` SDK against `sandboxd mcp` over stdio, whose sandbox is removed
outside sandboxd (`docker rm -f`) between two calls.

usage: client_vanish.py SANDBOXD   (the binary; the server gets only the Docker variables)
Prints one JSON object with what it saw; the Rust test checks it.
"""

import json
import os
import subprocess
import sys
import time

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

REASON = "its sandbox was removed outside sandboxd"


async def main(binary: str) -> dict:
    out: dict = {"errors": []}
    keep = ("SANDBOXD_DOCKER_IMAGE", "DOCKER_HOST", "SANDBOXD_LOG")
    env = {k: v for k, v in os.environ.items() if k in keep}
    params = StdioServerParameters(command=binary, args=["mcp"], env=env)
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()

            async def bash(command: str):
                res = await session.call_tool("bash", {"command": command})
                text = "\n".join(getattr(c, "text", "") for c in res.content)
                return bool(res.is_error), text

            err, text = await bash("echo kept > /workspace/f; hostname")
            assert not err, text
            out["first"] = text.strip()
            rm = subprocess.run(["docker", "rm", "-f", out["first"]], capture_output=True)
            out["removed"] = rm.returncode == 0
            # Calls until one says why (one that lands before the server heard the engine
            # fails on the dead container); every one must fail, none may start anew.
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                err, text = await bash("cat /workspace/f; hostname")
                out["errors"].append({"error": err, "text": text})
                if not err or REASON in text:
                    break
                await anyio.sleep(0.2)
            err, text = await bash("hostname; cat /workspace/f 2>/dev/null || echo absent")
            out["after"] = {"error": err, "text": text}
    return out


if __name__ == "__main__":
    print(json.dumps(anyio.run(main, sys.argv[1])))
