"""Frames between sandboxd (host) and its in-sandbox helpers.

A frame is b"SBX1" | u32 BE header length | JSON header | u32 BE body length | body.
The protocol channel is a private duplicate of the original stdout, so anything a user
program prints (even to fd 1) can never be taken for a frame.
"""
import json
import os
import struct
import sys

MAGIC = b"SBX1"


def claim_channel():
    """Moves the protocol onto private fds and points fds 0/1 at /dev/null.

    Returns (reader, writer) binary file objects for the protocol.
    """
    proto_in = os.dup(0)
    proto_out = os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.close(devnull)
    os.set_inheritable(proto_in, False)
    os.set_inheritable(proto_out, False)
    sys.stdout = open(os.devnull, "w")
    return os.fdopen(proto_in, "rb", buffering=0), os.fdopen(proto_out, "wb", buffering=0)


def _read_exact(reader, n):
    chunks = []
    while n > 0:
        chunk = reader.read(n)
        if not chunk:
            raise EOFError("the host closed the channel")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_frame(reader):
    magic = _read_exact(reader, 4)
    if magic != MAGIC:
        raise ValueError("bad magic %r" % magic)
    (hlen,) = struct.unpack(">I", _read_exact(reader, 4))
    header = json.loads(_read_exact(reader, hlen))
    (blen,) = struct.unpack(">I", _read_exact(reader, 4))
    body = _read_exact(reader, blen) if blen else b""
    return header, body


def write_frame(writer, header, body=b""):
    h = json.dumps(header).encode()
    view = memoryview(MAGIC + struct.pack(">I", len(h)) + h + struct.pack(">I", len(body)) + body)
    # The writer is unbuffered, so one write may take only part of the frame: gVisor's runsc
    # takes 64 KiB of a pipe write at a time. A half frame would stall the host forever.
    while view:
        n = writer.write(view)
        view = view[n:]
