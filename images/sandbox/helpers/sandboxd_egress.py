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
the helper sends more. Credit may be given back in any grouping: this helper sends one
CREDIT per connection per read of its stdin (not one per DATA frame), once the socket took
the bytes.

Speed (issue 24): everything runs in asyncio callbacks, with no await per frame. Stdin is
read frame by frame: a header alone, then a DATA payload is spliced from the pipe straight
into its client's socket (no copy through python); what the socket does not take at once is
read and left in the client's transport (whose write limits are 0, so pause_writing and
resume_writing say exactly when it is gone), and no splice goes to that socket until the
transport is empty again. The CREDIT frames owed after a pass over stdin leave in one write.

The protocol runs on private duplicates of fds 0/1 (sandboxd_proto.claim_channel), and the
process makes itself non-dumpable, so other processes of the sandbox user cannot open its
fds through /proc/PID/fd. The host treats everything it reads as hostile anyway.

Exit status: 0 the host closed stdin; 2 the host sent something malformed; 3 the port is
bound by another process (stderr says "port-taken"), e.g. another replica's helper.
"""
import asyncio
import ctypes
import errno
import fcntl
import os
import socket
import struct
import sys
import termios

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sandboxd_proto as proto  # noqa: E402

HELLO, OPEN, DATA, EOF, CLOSE, CREDIT, REFUSED = 1, 2, 3, 4, 5, 6, 7
HEADER = struct.Struct(">IBI")
COUNT = struct.Struct(">I")
# FIONREAD's answer: a native int.
COUNT_LE = struct.Struct("=i")
MAX_PAYLOAD = 64 * 1024
WINDOW = 256 * 1024
# Payload bytes one pass over stdin moves before the event loop's other callbacks run.
PASS = 1024 * 1024
# The channel's pipes are grown to this (Linux's default pipe-max-size for unprivileged
# processes): fewer, larger reads and writes per megabyte than with the default 64 KiB.
PIPE_SIZE = 1024 * 1024
F_SETPIPE_SZ = 1031
EXIT_PROTOCOL = 2
EXIT_PORT_TAKEN = 3
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


class Helper:
    """The connections and the channel's output (stdout, written without waiting: what it
    holds is bounded by the credit windows)."""

    def __init__(self, max_conns):
        self.out = None
        self.max = max_conns
        self.conns = {}
        self.next_id = 1
        # Connections owed a CREDIT, sent together after the current read of stdin.
        self.owed = set()

    def send(self, cid, kind, payload=b""):
        self.out.write(HEADER.pack(cid, kind, len(payload)) + payload)

    def flush_credit(self):
        frames = []
        for conn in self.owed:
            if conn.owed and not conn.blocked and self.conns.get(conn.cid) is conn:
                frames.append(HEADER.pack(conn.cid, CREDIT, 4) + COUNT.pack(conn.owed))
                conn.owed = 0
        self.owed.clear()
        if frames:
            self.out.write(b"".join(frames))

    def on_frame(self, cid, kind, payload):
        conn = self.conns.get(cid)
        if conn is None:
            # A connection this side closed already; frames in flight are dropped.
            if kind in (DATA, EOF, CLOSE, CREDIT) and cid < self.next_id:
                return
            fail(EXIT_PROTOCOL, "unexpected frame %d for connection %d" % (kind, cid))
        if kind == DATA:
            conn.to_client(payload)
        elif kind == EOF:
            if conn.transport.can_write_eof():
                conn.transport.write_eof()
        elif kind == CLOSE:
            # Forgotten now (the host no longer counts it); the bytes written before the
            # CLOSE still go out, then the socket closes.
            del self.conns[cid]
            conn.transport.close()
        elif kind == CREDIT and len(payload) == 4:
            conn.credit += COUNT.unpack(payload)[0]
            conn.to_host()
        else:
            fail(EXIT_PROTOCOL, "malformed frame %d for connection %d" % (kind, cid))


class Client(asyncio.Protocol):
    """One connection accepted on the proxy port."""

    def __init__(self, helper):
        self.helper = helper
        self.cid = 0
        self.transport = None
        # The socket's fd, for splice; -1 when the transport has none.
        self.fd = -1
        self.credit = WINDOW
        # Bytes read from the client beyond the credit: at most one read (reading pauses).
        self.pending = b""
        self.eof = False
        # Bytes written towards the client not yet given back as credit, and whether the
        # transport still holds some of them.
        self.owed = 0
        self.blocked = False

    def connection_made(self, transport):
        self.transport = transport
        h = self.helper
        if len(h.conns) >= h.max:
            transport.write(BUSY)
            transport.close()
            h.send(0, REFUSED)
            return
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.fd = sock.fileno()
        transport.set_write_buffer_limits(high=0, low=0)
        self.cid = h.next_id
        h.next_id += 1
        h.conns[self.cid] = self
        h.send(self.cid, OPEN)

    def live(self):
        return self.cid != 0 and self.helper.conns.get(self.cid) is self

    def data_received(self, data):
        if not self.live():
            return
        self.pending = self.pending + data if self.pending else data
        self.to_host()

    def eof_received(self):
        self.eof = True
        self.to_host()
        # Kept open for writing: the answer may still be coming (a half close).
        return True

    def to_host(self):
        """Client -> host, never more than the host's credit in flight."""
        if not self.live():
            return
        h = self.helper
        while self.pending and self.credit > 0:
            n = min(len(self.pending), self.credit, MAX_PAYLOAD)
            h.send(self.cid, DATA, self.pending[:n])
            self.pending = self.pending[n:]
            self.credit -= n
        if self.pending:
            self.transport.pause_reading()
            return
        if self.eof:
            self.eof = False
            h.send(self.cid, EOF)
        elif not self.transport.is_closing():
            self.transport.resume_reading()

    def to_client(self, payload):
        """Host -> client: written now; its credit goes back once the socket took it."""
        self.transport.write(payload)
        self.owed += len(payload)
        self.helper.owed.add(self)

    def can_splice(self):
        """Whether bytes may go into the socket behind the transport: only when it holds
        none, so the order of the bytes stays the host's."""
        t = self.transport
        return self.fd >= 0 and not self.blocked and not t.is_closing() and (
            t.get_write_buffer_size() == 0
        )

    def spliced(self, n):
        """n bytes went into the socket: their credit goes back after this pass."""
        self.owed += n
        self.helper.owed.add(self)

    def pause_writing(self):
        self.blocked = True

    def resume_writing(self):
        self.blocked = False
        if self.owed and self.live():
            self.helper.owed.add(self)
            self.helper.flush_credit()

    def connection_lost(self, exc):
        if self.live():
            del self.helper.conns[self.cid]
            self.helper.send(self.cid, CLOSE)


class Channel:
    """The host's frames on stdin. A frame's header is read alone; a DATA payload goes from
    the pipe straight into its client's socket with splice(2) (no copy through python) while
    that socket takes it; what the socket does not take at once is read and left in the
    client's transport, which then holds the rest of that payload (at most one frame). Other
    frames (CREDIT, EOF, CLOSE) are read whole. The CREDIT frames owed leave after each pass."""

    def __init__(self, helper, fd):
        self.helper = helper
        self.fd = fd
        self.head = b""
        # The DATA frame whose payload is being moved: [connection or None, bytes left].
        self.data = None
        # A frame other than DATA being read: [id, type, length, payload so far].
        self.frame = None
        # Payload bytes moved since credit was last sent back.
        self.moved = 0
        self.splice = hasattr(os, "splice")

    def readable(self):
        """One pass over what stdin holds: at most PASS bytes of payload before the loop's
        other callbacks get their turn, the credit owed sent back every half window."""
        moved = 0
        try:
            while moved < PASS:
                before = self.moved
                if not self.step():
                    break
                moved += self.moved - before
                if self.moved >= WINDOW // 2:
                    self.helper.flush_credit()
                    self.moved = 0
        finally:
            self.helper.flush_credit()

    def read(self, n):
        """Up to n bytes of stdin; None when the pipe is empty for now."""
        try:
            b = os.read(self.fd, n)
        except BlockingIOError:
            return None
        if not b:
            os._exit(0)  # the host closed stdin
        return b

    def step(self):
        """Moves what stdin holds for one frame; False when it must wait for more."""
        if self.data is not None:
            return self.payload()
        if self.frame is not None:
            return self.small()
        b = self.read(HEADER.size - len(self.head))
        if b is None:
            return False
        self.head += b
        if len(self.head) < HEADER.size:
            return True
        cid, kind, length = HEADER.unpack(self.head)
        self.head = b""
        if length > MAX_PAYLOAD:
            fail(EXIT_PROTOCOL, "a frame of %d bytes is over the limit" % length)
        if kind == DATA and length:
            conn = self.helper.conns.get(cid)
            if conn is None and not cid < self.helper.next_id:
                fail(EXIT_PROTOCOL, "unexpected frame %d for connection %d" % (kind, cid))
            self.data = [conn, length]
        else:
            self.frame = [cid, kind, length, b""]
        return True

    def small(self):
        """Reads the rest of a frame other than DATA, then handles it."""
        cid, kind, length, payload = self.frame
        if len(payload) < length:
            b = self.read(length - len(payload))
            if b is None:
                return False
            payload += b
            self.frame[3] = payload
            if len(payload) < length:
                return True
        self.frame = None
        self.helper.on_frame(cid, kind, payload)
        return True

    def payload(self):
        """Moves the current DATA payload on; False when the pipe is empty for now."""
        conn, left = self.data
        if conn is not None and not conn.live():
            conn = self.data[0] = None
        moved = None
        if conn is not None and self.splice and conn.can_splice():
            moved = self.splice_to(conn, left)
            if moved is False:
                return False
        if moved is None:
            b = self.read(left)
            if b is None:
                return False
            if conn is not None:
                conn.to_client(b)
            moved = len(b)
        left -= moved
        self.moved += moved
        self.data = [conn, left] if left else None
        return True

    def splice_to(self, conn, left):
        """Bytes spliced into the socket; False if the pipe is empty; None when the socket
        takes none now (or splice cannot be used): the caller reads them instead."""
        try:
            n = os.splice(self.fd, conn.fd, left, flags=os.SPLICE_F_NONBLOCK | os.SPLICE_F_MOVE)
        except BlockingIOError:
            # Either end may be the one that would block: the pipe's count tells which.
            avail = fcntl.ioctl(self.fd, termios.FIONREAD, b"\0\0\0\0")
            return False if COUNT_LE.unpack(avail)[0] == 0 else None
        except OSError as e:
            if e.errno in (errno.EINVAL, errno.ENOSYS):
                self.splice = False  # not on this kernel / these fds: read and write
            return None
        if n == 0:
            os._exit(0)  # the host closed stdin
        conn.spliced(n)
        return n


def grow_pipe(f):
    """Best effort: the pipe keeps its size where the kernel refuses (not a pipe, a limit)."""
    try:
        fcntl.fcntl(f.fileno(), F_SETPIPE_SZ, PIPE_SIZE)
    except OSError:
        pass


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
    grow_pipe(proto_in)
    grow_pipe(proto_out)
    sock = listen(port)
    loop = asyncio.get_running_loop()
    helper = Helper(max_conns)
    helper.out, _ = await loop.connect_write_pipe(asyncio.Protocol, proto_out)
    os.set_blocking(proto_in.fileno(), False)
    channel = Channel(helper, proto_in.fileno())
    loop.add_reader(proto_in.fileno(), channel.readable)
    await loop.create_server(lambda: Client(helper), sock=sock)
    helper.send(0, HELLO, b"sandboxd-egress/1")
    await asyncio.Event().wait()


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
