"""A minimal stdio MCP server in plain Python (the sandbox image has no MCP SDK), for
`sandboxd bench mcp`: one tool, `echo`, that returns its `text`. The same script runs inside
a session's sandbox and on the host, so the difference between the two is the cost of the
sandbox's exec channel."""

import json
import sys


def answer(msg):
    method = msg.get("method")
    if method == "initialize":
        return {
            "protocolVersion": msg["params"]["protocolVersion"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "echo", "version": "1"},
        }
    if method == "tools/list":
        schema = {"type": "object", "properties": {"text": {"type": "string"}}}
        return {"tools": [{"name": "echo", "description": "Returns its text.", "inputSchema": schema}]}
    if method == "tools/call":
        text = msg["params"].get("arguments", {}).get("text", "")
        return {"content": [{"type": "text", "text": text}], "isError": False}
    if method == "ping":
        return {}
    return None


for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg:
        continue
    result = answer(msg)
    if result is None:
        reply = {"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32601, "message": "no such method"}}
    else:
        reply = {"jsonrpc": "2.0", "id": msg["id"], "result": result}
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()
