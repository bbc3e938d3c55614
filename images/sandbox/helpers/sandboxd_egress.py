"""sandboxd egress helper: the session's HTTP proxy endpoint on the sandbox's own loopback.

The container has no network device. This helper listens on 127.0.0.1:PORT (3128) and
carries every accepted connection, byte for byte, to the host over its stdio; the host
parses the request, decides, connects and relays (crates/core/src/egress). The helper
decides nothing: it only multiplexes.

    sandboxd_egress.py --port 3128 --max N

Frames, both ways: u32 BE connection id | u8 type | u32 BE payload length | payload.
    HELLO   1  helper -> host, id 0, b"sandboxd-egress/1": listening, ready
    OPEN    2  helper -> host: a new connection (ids only grow)
    DATA    3  bytes of one connection (at most MAX_PAYLOAD)
    EOF     4  the sender will send no more bytes on this connection (half close)
    CLOSE   5  the connection is over (the host ends every connection with it)
    CREDIT  6  u32 BE: the receiver consumed that many bytes; the sender may send them again
    REFUSED 7  helper -> host, id 0: a connection refused here, the helper being at --max
Each side may have at most WINDOW unacknowledged DATA bytes per connection in flight, so
neither side buffers more than that per connection; the host tears the channel down when
the helper sends more.

The protocol runs on private duplicates of fds 0/1 (sandboxd_proto.claim_channel), and the
process makes itself non-dumpable, so other processes of the sandbox user cannot open its
fds through /proc/PID/fd. The host treats everything it reads as hostile anyway.

Exit status: 0 the host closed stdin; 2 the host sent something malformed; 3 the port is
bound by another process (stderr says "port-taken"), e.g. another replica's helper.
"""
import asyncio
import ctypes
import errno
import os
import socket
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sandboxd_proto as proto  # noqa: E402

HELLO, OPEN, DATA, EOF, CLOSE, CREDIT, REFUSED = 1, 2, 3, 4, 5, 6, 7
HEADER = struct.Struct(">IBI")
MAX_PAYLOAD = 64 * 1024
WINDOW = 256 * 1024
CHUNK = 16 * 1024
EXIT_PROTOCOL = 2
EXIT_PORT_TAKEN = 3
CLOSING = object()
BUSY = (
    b"HTTP/1.1 403 Forbidden\r\nX-Sandboxd-Refused: connections\r\nContent-Type: text/plain\r\n"
    b"Content-Length: 61\r\nConnection: close\r\n\r\n"
    b"refused by the egress proxy: too many connections are open.\r\n"
)


def fail(code, message):
    try:
        os.write(2, ("sandboxd_egress: %s\n" % message).encode())
    except OSError:
        pass
    os._exit(code)


def no_dumps():
    """PR_SET_DUMPABLE 0: /proc/PID/fd of this process becomes root's, not the sandbox user's."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass


class Conn:
    def __init__(self, cid, reader, writer):
        self.cid = cid
        self.reader = reader
        self.writer = writer
        self.credit = WINDOW
        self.credit_event = asyncio.Event()
        self.down = asyncio.Queue()
        self.tasks = []


class Helper:
    def __init__(self, out, max_conns):
        self.out = out
        self.max = max_conns
        self.conns = {}
        self.next_id = 1

    async def send(self, cid, kind, payload=b""):
        self.out.write(HEADER.pack(cid, kind, len(payload)) + payload)
        await self.out.drain()

    async def accept(self, reader, writer):
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if len(self.conns) >= self.max:
            try:
                writer.write(BUSY)
                await writer.drain()
            except OSError:
                pass
            writer.close()
            await self.send(0, REFUSED)
            return
        cid = self.next_id
        self.next_id += 1
        conn = Conn(cid, reader, writer)
        self.conns[cid] = conn
        # The tasks run from the next await on, after OPEN is written (write() is synchronous).
        conn.tasks = [asyncio.ensure_future(self.up(conn)), asyncio.ensure_future(self.down(conn))]
        await self.send(cid, OPEN)

    async def up(self, conn):
        """Client -> host, never more than the host's credit in flight."""
        try:
            while True:
                while conn.credit <= 0:
                    conn.credit_event.clear()
                    await conn.credit_event.wait()
                data = await conn.reader.read(min(CHUNK, conn.credit))
                if conn.cid not in self.conns:
                    return
                if not data:
                    await self.send(conn.cid, EOF)
                    return
                conn.credit -= len(data)
                await self.send(conn.cid, DATA, data)
        except (OSError, ConnectionError):
            await self.abort(conn)

    async def down(self, conn):
        """Host -> client: write, wait until the socket took it, then give the credit back.
        Ends at the host's CLOSE, after what came before it was written."""
        try:
            while True:
                item = await conn.down.get()
                if item is None:
                    conn.writer.write_eof()
                    continue
                if item is CLOSING:
                    conn.writer.close()
                    return
                conn.writer.write(item)
                await conn.writer.drain()
                if conn.cid in self.conns:
                    await self.send(conn.cid, CREDIT, struct.pack(">I", len(item)))
        except (OSError, ConnectionError):
            await self.abort(conn)

    async def abort(self, conn):
        if self.conns.pop(conn.cid, None) is None:
            return
        self.finish(conn)
        await self.send(conn.cid, CLOSE)

    def finish(self, conn):
        for t in conn.tasks:
            if t is not asyncio.current_task():
                t.cancel()
        conn.writer.transport.abort()

    def on_frame(self, cid, kind, payload):
        conn = self.conns.get(cid)
        if conn is None:
            # A connection this side closed already; frames in flight are dropped.
            if kind in (DATA, EOF, CLOSE, CREDIT) and cid < self.next_id:
                return
            fail(EXIT_PROTOCOL, "unexpected frame %d for connection %d" % (kind, cid))
        if kind == DATA:
            conn.down.put_nowait(payload)
        elif kind == EOF:
            conn.down.put_nowait(None)
        elif kind == CLOSE:
            # Forgotten now (the host no longer counts it); the bytes queued before the CLOSE
            # are still written, then the socket closes.
            del self.conns[cid]
            conn.tasks[0].cancel()
            conn.down.put_nowait(CLOSING)
        elif kind == CREDIT and len(payload) == 4:
            conn.credit += struct.unpack(">I", payload)[0]
            conn.credit_event.set()
        else:
            fail(EXIT_PROTOCOL, "malformed frame %d for connection %d" % (kind, cid))


def listen(port):
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            fail(EXIT_PORT_TAKEN, "port-taken: 127.0.0.1:%d is bound by another process" % port)
        raise
    sock.listen(128)
    sock.setblocking(False)
    return sock


async def main(port, max_conns):
    proto_in, proto_out = proto.claim_channel()
    no_dumps()
    sock = listen(port)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=2 * MAX_PAYLOAD)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), proto_in)
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, proto_out)
    out = asyncio.StreamWriter(transport, protocol, None, loop)
    helper = Helper(out, max_conns)
    await asyncio.start_server(helper.accept, sock=sock)
    await helper.send(0, HELLO, b"sandboxd-egress/1")
    while True:
        try:
            head = await reader.readexactly(HEADER.size)
        except asyncio.IncompleteReadError:
            os._exit(0)
        cid, kind, length = HEADER.unpack(head)
        if length > MAX_PAYLOAD:
            fail(EXIT_PROTOCOL, "a frame of %d bytes is over the limit" % length)
        try:
            payload = await reader.readexactly(length) if length else b""
        except asyncio.IncompleteReadError:
            os._exit(0)
        helper.on_frame(cid, kind, payload)


def args():
    port, max_conns = 3128, 64
    argv = sys.argv[1:]
    while argv:
        flag = argv.pop(0)
        if flag == "--port" and argv:
            port = int(argv.pop(0))
        elif flag == "--max" and argv:
            max_conns = int(argv.pop(0))
        else:
            fail(EXIT_PROTOCOL, "usage: sandboxd_egress.py [--port N] [--max N]")
    return port, max_conns


if __name__ == "__main__":
    asyncio.run(main(*args()))
