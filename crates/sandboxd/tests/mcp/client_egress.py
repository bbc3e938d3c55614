"""The official Python `mcp` SDK against serve's /mcp, for the egress of an MCP sandbox.

usage: client_egress.py URL TOKEN PORT PUT   (PUT: "put" to turn the sandbox's egress off
                                                through PUT /v1/sessions/{id}/egress between
                                                two calls, "keep" not to)
In the SDK's default mode (stateless when offered) it makes a sandbox, asks bash for the
proxy variable and curls http://localhost:PORT/ through the proxy, reads the sandbox's
session and egress on /v1 with the same key, optionally turns the egress off and curls
again, then closes the sandbox. Prints one JSON object with what it saw.
"""

import asyncio
import json
import sys
import urllib.error
import urllib.request

from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


def texts(result):
    return "\n".join(c.text for c in result.content if getattr(c, "type", "") == "text")


def curl(port: str, path: str) -> str:
    # The proxy named explicitly: with egress off the variables are unset, and the refusal
    # (with its reason) comes from the proxy itself; NO_PROXY (the sandbox's own loopback)
    # would keep curl off the proxy for localhost, which stands for a host on the web here.
    return (
        'echo "[$HTTP_PROXY]"; '
        "env -u NO_PROXY -u no_proxy "
        f"curl -sS --max-time 20 -x http://127.0.0.1:3128 http://localhost:{port}/{path} 2>&1; true"
    )


class Api:
    """serve's /v1 with the same key (the standard library: the SDK's venv is all there is)."""

    def __init__(self, base: str, token: str):
        self.base, self.token = base, token

    def call(self, method: str, path: str, body=None) -> tuple:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.token}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    async def get(self, path: str) -> dict:
        return (await asyncio.to_thread(self.call, "GET", path))[1]


async def main(url: str, token: str, port: str, put: str) -> dict:
    out: dict = {}
    auth = {"Authorization": f"Bearer {token}"}
    api = Api(url.rsplit("/mcp", 1)[0], token)
    http = create_mcp_http_client(headers=auth)
    async with http:
        async with Client(streamable_http_client(url, http_client=http), mode="auto") as client:
            tools = [t.name for t in (await client.list_tools()).tools]
            extra = {}
            if "sandbox_create" in tools:
                created = await client.call_tool("sandbox_create", {})
                extra = {"sandbox_id": texts(created).split()[1]}

            async def bash(command: str) -> str:
                r = await client.call_tool("bash", {"command": command, **extra})
                return texts(r)

            out["first"] = await bash(curl(port, "first"))
            listed = (await api.get("/v1/sessions"))["sessions"]
            mine = [s for s in listed if s["kind"] == "mcp" and s["state"] == "running"]
            out["sessions"] = mine
            sid = mine[0]["id"] if mine else ""

            async def egress(done) -> dict:
                # A connection's record is written as it ends: give it a moment.
                for _ in range(100):
                    seen = await api.get(f"/v1/sessions/{sid}/egress")
                    if done(seen.get("recent") or []):
                        break
                    await asyncio.sleep(0.1)
                return seen

            out["egress"] = await egress(lambda recent: put != "put" or len(recent) > 0)
            if put == "put":
                status, body = await asyncio.to_thread(
                    api.call, "PUT", f"/v1/sessions/{sid}/egress", {"egress": "off"}
                )
                out["put"] = {"status": status, "body": body}
                out["after"] = await bash(curl(port, "after-off"))
                out["egress_after"] = await egress(
                    lambda recent: any(not r["allowed"] for r in recent)
                )
            if extra:
                await client.call_tool("sandbox_close", extra)
    return out


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(*sys.argv[1:5]))))
