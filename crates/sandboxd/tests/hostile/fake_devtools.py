"""A fake DevTools server, as sandboxed code would plant one: python3 fake_devtools.py MODE PORT.

Once listening it touches /tmp/fake-ready-PORT, so a test waits for it without connecting (a
probe connection would itself touch the hit file, possibly after the test removed it). It accepts
connections for ever, touches /tmp/fake-hit-PORT on each, answers the websocket upgrade properly
and then attacks the client:

    huge     a binary frame header claiming 2**45 bytes, then zeros for ever
    endless  a text message that never ends: 1 MiB continuation frames for ever
    head     an upgrade response whose header lines never end
"""
import base64
import hashlib
import socket
import struct
import sys
import threading

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def serve(conn, mode, port):
    open("/tmp/fake-hit-%d" % port, "w").close()
    try:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(4096)
            if not chunk:
                return
            data += chunk
        if mode == "head":
            conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\n")
            while True:
                conn.sendall(b"X-Filler: " + b"a" * 4000 + b"\r\n")
        key = b""
        for line in data.split(b"\r\n"):
            if line.lower().startswith(b"sec-websocket-key:"):
                key = line.split(b":", 1)[1].strip()
        accept = base64.b64encode(hashlib.sha1(key + GUID).digest())
        conn.sendall(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n"
        )
        mib = b"a" * (1 << 20)
        if mode == "huge":
            conn.sendall(b"\x82\x7f" + struct.pack(">Q", 1 << 45))
            while True:
                conn.sendall(b"\0" * (1 << 20))
        else:
            conn.sendall(b"\x01\x7f" + struct.pack(">Q", len(mib)) + mib)
            while True:
                conn.sendall(b"\x00\x7f" + struct.pack(">Q", len(mib)) + mib)
    except OSError:
        pass
    finally:
        conn.close()


def main():
    mode, port = sys.argv[1], int(sys.argv[2])
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen(8)
    open("/tmp/fake-ready-%d" % port, "w").close()
    while True:
        conn, _ = s.accept()
        threading.Thread(target=serve, args=(conn, mode, port), daemon=True).start()


main()
