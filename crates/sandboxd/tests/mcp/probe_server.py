"""A minimal stdio MCP server in plain Python (no SDK: the sandbox image has none), written for
tests/mcp_in_sandbox.rs. One tool, `whereami`, reports where its process runs: its cgroup, its
uid, whether an outside connection works, and whether the path given as argv[1] exists.
"""

import json
import os
import socket
import sys


def whereami():
    try:
        socket.create_connection(("192.0.2.1", 80), timeout=2).close()
        net = "connected"
    except OSError as e:
        net = f"refused: {e}"
    with open("/proc/self/cgroup") as f:
        cgroup = f.read().strip()
    probe = sys.argv[1] if len(sys.argv) > 1 else "/"
    return {"cgroup": cgroup, "uid": os.getuid(), "net": net, "host_path_exists": os.path.exists(probe)}


def answer(msg):
    method = msg.get("method")
    if method == "initialize":
        return {
            "protocolVersion": msg["params"]["protocolVersion"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "probe", "version": "1"},
        }
    if method == "tools/list":
        schema = {"type": "object", "properties": {}}
        return {"tools": [{"name": "whereami", "description": "Where this server runs.", "inputSchema": schema}]}
    if method == "tools/call":
        text = json.dumps(whereami())
        return {"content": [{"type": "text", "text": text}], "isError": False}
    if method == "ping":
        return {}
    return None


for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg:
        continue  # a notification
    result = answer(msg)
    if result is None:
        reply = {"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32601, "message": "no such method"}}
    else:
        reply = {"jsonrpc": "2.0", "id": msg["id"], "result": result}
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()
