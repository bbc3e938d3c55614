"""sandboxd python driver: one persistent interpreter per session, driven like a notebook kernel.

It runs as a daemon of the container (`sandboxd_py.py --listen SOCKET`, started by
sandboxd_pyrelay.py), so its variables outlive the sandboxd process that first used it. Each
sandboxd process connects through the relay; the newest connection wins (the one it replaces
gets a {"replaced": true} frame and is closed). On every connection it sends a hello frame:

    {"hello": "sandboxd_py", "pid": P, "running": ID or null, "last_id": N, "cells": C}

(`running`: a cell still in progress, left by an earlier connection; `last_id`: the largest
cell id it was sent, so a new process numbers its cells after it). Then frames
(see sandboxd_proto.py):

    {"op": "execute", "id": N, "output_cap": BYTES, "live": BOOL}  body: the cell's source (UTF-8)
    {"op": "interrupt", "id": N}                     raise KeyboardInterrupt in cell N, if it runs
    {"op": "exit"}                                   leave at once

Each execute is answered by one frame whose header names the sizes of the body's parts, in
this order: stdout, stderr, value (the repr of a final expression), error (a traceback) and
images (the PNGs of the cell's figures, in order, back to back; the header's "images" lists
their sizes: at most SHOWN_LIMIT of them and IMAGE_LIMIT bytes together, every figure is saved
and listed in "figures" whether shown or not). The reply goes to whichever connection is current when
the cell ends (a cell outlives a connection that dropped). A reader thread per connection
takes frames while a cell runs, so an interrupt reaches the main thread at once with
pthread_kill; processes the cell started get SIGINT too (like Ctrl-C in a terminal),
processes of earlier cells are left alone.

During a cell, fds 1 and 2 point at unlinked files in /tmp (so output of os.system and of
subprocesses is captured too, and the driver never holds more than the cap in memory); the
head and the tail of each are read back and the middle is cut.

A live cell ("live": true) has its output sent while it runs: a tailer thread reads what was
written to each file since the last look, every TAIL_EVERY, and sends it as frames
{"id": N, "chunk": "stdout" | "stderr"} (body: the bytes, at most CHUNK_LIMIT each), up to
`output_cap` bytes per stream in all. Its reply then carries, for each stream, only what was
not sent: nothing, or (past the cap) a marker and the tail.
"""
import ast
import builtins
import faulthandler
import io
import linecache
import os
import queue
import signal
import socket
import struct
import sys
import tempfile
import threading
import time
import traceback
import types
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sandboxd_proto as proto  # noqa: E402

del sys.path[0]

DRIVER_FILES = {__file__, os.path.abspath(__file__)}
FIGURE_DIR = "/workspace/figures"
IMAGE_LIMIT = 4 << 20
SHOWN_LIMIT = 8
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
TAIL_EVERY = 0.05
CHUNK_LIMIT = 64 * 1024
DRIVER_MODULE = None


class State:
    """What the reader threads need to know about the running cell."""

    lock = threading.Lock()
    running = None  # id of the cell in progress
    started_ticks = 0  # its start, in the clock of /proc/PID/stat
    main_ident = threading.main_thread().ident
    last_id = 0  # the largest cell id any connection sent
    cells = 0  # cells run by this interpreter


class Channel:
    """The current connection to a sandboxd process (one at a time; the newest wins)."""

    lock = threading.Lock()  # guards `current`, `generation` and every write to a connection
    current = None  # the connected socket
    generation = 0  # bumped by each new connection; requests of older ones are dropped
    private_fds = set()  # fds a forked child must not keep (the listener, connections, stderr)

    @classmethod
    def adopt(cls, conn):
        """Makes `conn` the current connection (after its hello); returns its generation."""
        with cls.lock:
            old, cls.current = cls.current, conn
            cls.generation += 1
            gen = cls.generation
            cls.private_fds.add(conn.fileno())
            if old is not None:
                try:
                    old.settimeout(1)
                    send_frame(old, {"replaced": True}, b"")
                except OSError:
                    pass
                cls.forget(old)
        return gen

    @classmethod
    def forget(cls, conn):
        """Closes `conn` (caller holds the lock); a reader blocked on it sees the end."""
        cls.private_fds.discard(conn.fileno())
        try:
            conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        conn.close()

    @classmethod
    def drop(cls, gen):
        with cls.lock:
            if cls.generation == gen and cls.current is not None:
                cls.forget(cls.current)
                cls.current = None

    @classmethod
    def reply(cls, header, body):
        """Sends a cell's reply on the current connection, if any (a broken one is dropped)."""
        with cls.lock:
            conn = cls.current
            if conn is None:
                return
            try:
                send_frame(conn, header, body)
            except OSError:
                cls.forget(conn)
                cls.current = None


def boot_ticks():
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * CLOCK_TICKS)


def descendants_since(ticks):
    """Our descendant processes started at or after `ticks` (the cell's own children)."""
    parents, started = {}, {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as f:
                data = f.read()
            fields = data[data.rindex(b")") + 2:].split()
            parents[int(name)] = int(fields[1])
            started[int(name)] = int(fields[19])
        except (OSError, ValueError, IndexError):
            pass
    children = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    found, stack = [], [os.getpid()]
    while stack:
        for child in children.get(stack.pop(), []):
            stack.append(child)
            if started.get(child, 0) >= ticks:
                found.append(child)
    return found


def interrupt(cell_id):
    with State.lock:
        if State.running is None or State.running != cell_id:
            return
        signal.pthread_kill(State.main_ident, signal.SIGINT)
        since = State.started_ticks
    for pid in descendants_since(since):
        try:
            os.kill(pid, signal.SIGINT)
        except OSError:
            pass


def on_sigint(signum, frame):
    # A late interrupt that lands after its cell ended must not hit the driver itself.
    if State.running is not None:
        raise KeyboardInterrupt


def reader_loop(conn, gen, requests):
    reader = conn.makefile("rb", buffering=0)
    while True:
        try:
            req, body = proto.read_frame(reader)
        except BaseException:
            # The host closed the channel or spoke garbage: wait for the next connection.
            Channel.drop(gen)
            return
        if not isinstance(req, dict):
            Channel.drop(gen)
            return
        cell_id = req.get("id")
        if isinstance(cell_id, int) and not isinstance(cell_id, bool) and 0 < cell_id < 2**53:
            with State.lock:
                State.last_id = max(State.last_id, cell_id)
        if req.get("op") == "interrupt":
            interrupt(cell_id)
        else:
            requests.put((gen, req, body))


def accept_loop(listener, requests):
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            time.sleep(0.1)
            continue
        try:
            with State.lock:
                hello = {
                    "ok": True,
                    "hello": "sandboxd_py",
                    "pid": os.getpid(),
                    "python": sys.version.split()[0],
                    "running": State.running,
                    "last_id": State.last_id,
                    "cells": State.cells,
                }
            conn.settimeout(10)
            send_frame(conn, hello, b"")
            conn.settimeout(None)
        except OSError:
            conn.close()
            continue
        gen = Channel.adopt(conn)
        threading.Thread(target=reader_loop, args=(conn, gen, requests), name="sandboxd-reader", daemon=True).start()


def send_frame(conn, header, body):
    h = proto.json.dumps(header).encode()
    # sendall retries short writes; a half frame would desynchronize the host.
    conn.sendall(proto.MAGIC + struct.pack(">I", len(h)) + h + struct.pack(">I", len(body)) + body)


def cut_middle(data, cap):
    if len(data) <= cap:
        return data, False
    half = cap // 2
    marker = ("\n[... %d bytes cut by sandboxd ...]\n" % (len(data) - cap)).encode()
    return data[:half] + marker + data[len(data) - (cap - half):], True


def read_capped(f, cap):
    fd = f.fileno()
    size = os.fstat(fd).st_size
    if size <= cap:
        return pread_all(fd, size, 0), False
    half = cap // 2
    tail = cap - half
    marker = ("\n[... %d bytes cut by sandboxd ...]\n" % (size - cap)).encode()
    return pread_all(fd, half, 0) + marker + pread_all(fd, tail, size - tail), True


def pread_all(fd, n, offset):
    chunks = []
    while n > 0:
        chunk = os.pread(fd, n, offset)
        if not chunk:
            break
        chunks.append(chunk)
        n -= len(chunk)
        offset += len(chunk)
    return b"".join(chunks)


class Tailer:
    """Sends a live cell's output as it is written: up to `cap` bytes of each stream."""

    def __init__(self, cell_id, files, cap):
        self.cell_id = cell_id
        self.files = files  # (name, file) pairs
        self.cap = cap
        self.sent = [0] * len(files)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop, name="sandboxd-tailer", daemon=True)
        self.thread.start()

    def loop(self):
        while not self.stop.wait(TAIL_EVERY):
            self.send_new()

    def send_new(self):
        for i, (name, f) in enumerate(self.files):
            while self.sent[i] < self.cap:
                fd = f.fileno()
                n = min(os.fstat(fd).st_size - self.sent[i], self.cap - self.sent[i], CHUNK_LIMIT)
                if n <= 0:
                    break
                data = pread_all(fd, n, self.sent[i])
                if not data:
                    break
                self.sent[i] += len(data)
                Channel.reply({"id": self.cell_id, "chunk": name}, data)

    def finish(self):
        """Stops the thread and sends what is left within the caps; returns, per stream, what
        was not sent (a marker and the tail past the cap) and whether it was cut."""
        self.stop.set()
        self.thread.join()
        self.send_new()
        rests = []
        for i, (_, f) in enumerate(self.files):
            fd = f.fileno()
            rest = os.fstat(fd).st_size - self.sent[i]
            tail = self.cap // 2
            if rest <= 0:
                rests.append((b"", False))
            elif rest <= tail:
                rests.append((pread_all(fd, rest, self.sent[i]), False))
            else:
                marker = ("\n[... %d bytes cut by sandboxd ...]\n" % (rest - tail)).encode()
                rests.append((marker + pread_all(fd, tail, self.sent[i] + rest - tail), True))
        return rests


def text_writer(fd):
    # Unbuffered text on the raw fd keeps print() and os.system() output in order.
    return io.TextIOWrapper(
        io.FileIO(fd, "w", closefd=False),
        encoding="utf-8",
        errors="backslashreplace",
        line_buffering=True,
        write_through=True,
    )


def user_traceback(exc):
    """The traceback as the user's code sees it: every driver frame is left out."""
    te = traceback.TracebackException(type(exc), exc, exc.__traceback__)
    seen, todo = set(), [te]
    while todo:
        t = todo.pop()
        if t is None or id(t) in seen:
            continue
        seen.add(id(t))
        t.stack = traceback.StackSummary.from_list([f for f in t.stack if f.filename not in DRIVER_FILES])
        todo.extend([t.__cause__, t.__context__])
    return "".join(te.format())


class Figures:
    counter = 0

    @classmethod
    def next_path(cls):
        while True:
            cls.counter += 1
            path = "%s/figure-%d.png" % (FIGURE_DIR, cls.counter)
            if not os.path.exists(path):
                return path

    @classmethod
    def collect(cls):
        """Saves and closes every open pyplot figure; returns (paths, PNGs to show): the
        figures in order while they fit SHOWN_LIMIT and IMAGE_LIMIT bytes together."""
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is None:
            return [], []
        paths, shown, total = [], [], 0
        for num in plt.get_fignums():
            fig = plt.figure(num)
            try:
                buf = io.BytesIO()
                fig.savefig(buf, format="png")
                data = buf.getvalue()
                os.makedirs(FIGURE_DIR, exist_ok=True)
                path = cls.next_path()
                with open(path, "wb") as f:
                    f.write(data)
                paths.append(path)
                if len(shown) < SHOWN_LIMIT and total + len(data) <= IMAGE_LIMIT:
                    shown.append(data)
                    total += len(data)
            except Exception as exc:  # one bad figure must not lose the cell's result
                sys.stderr.write("sandboxd: could not save figure %s: %r\n" % (num, exc))
            finally:
                plt.close(fig)
        return paths, shown


class Cell:
    count = 0

    def __init__(self, ns, saved_stderr):
        self.ns = ns
        self.saved_stderr = saved_stderr
        self.devnull = os.open(os.devnull, os.O_RDWR)

    def run(self, req, source):
        Cell.count += 1
        cell_id = req.get("id")
        cap = max(1024, int(req.get("output_cap", 256 * 1024)))
        filename = "<cell-%d>" % Cell.count
        code = source.decode("utf-8", "replace")
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        out_f = tempfile.TemporaryFile(dir="/tmp", prefix="sandboxd-py-")
        err_f = tempfile.TemporaryFile(dir="/tmp", prefix="sandboxd-py-")
        value = error = ""
        figures, images, interrupted = [], [], False
        tailer = None
        if req.get("live") is True:
            tailer = Tailer(cell_id, [("stdout", out_f), ("stderr", err_f)], cap)
        try:
            os.dup2(out_f.fileno(), 1)
            os.dup2(err_f.fileno(), 2)
            sys.stdout, sys.stderr = text_writer(1), text_writer(2)
            if getattr(sys.stdin, "closed", True):
                sys.stdin = open(os.devnull)
            signal.signal(signal.SIGINT, on_sigint)
            try:
                tree = ast.parse(code, filename)
                last = None
                if tree.body and isinstance(tree.body[-1], ast.Expr):
                    last = compile(ast.Expression(tree.body.pop().value), filename, "eval")
                body = compile(tree, filename, "exec")
            except (SyntaxError, ValueError, OverflowError, MemoryError, RecursionError) as exc:
                error = "".join(traceback.format_exception_only(type(exc), exc))
            else:
                try:
                    with State.lock:
                        State.running, State.started_ticks = cell_id, boot_ticks()
                    try:
                        exec(body, self.ns)
                        result = eval(last, self.ns) if last is not None else None
                        if result is not None:
                            self.ns["_"] = result
                            value = repr(result)
                    finally:
                        try:
                            figures, images = Figures.collect()
                        finally:
                            with State.lock:
                                State.running = None
                except BaseException as exc:
                    interrupted = isinstance(exc, KeyboardInterrupt)
                    try:
                        error = user_traceback(exc)
                    except BaseException as exc2:
                        error = "%s (and formatting its traceback failed: %r)" % (type(exc).__name__, exc2)
        finally:
            with State.lock:
                State.running = None
            signal.signal(signal.SIGINT, on_sigint)
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except BaseException:
                    pass
            sys.stdout = open(os.devnull, "w")
            sys.stderr = text_writer(2)
            os.dup2(self.devnull, 1)
            os.dup2(self.saved_stderr, 2)
        if tailer is not None:
            (stdout, stdout_cut), (stderr, stderr_cut) = tailer.finish()
        else:
            stdout, stdout_cut = read_capped(out_f, cap)
            stderr, stderr_cut = read_capped(err_f, cap)
        out_f.close()
        err_f.close()
        value, _ = cut_middle(value.encode("utf-8", "backslashreplace"), cap)
        error, _ = cut_middle(error.encode("utf-8", "backslashreplace"), cap)
        parts = [stdout, stderr, value, error, b"".join(images)]
        header = {
            "id": cell_id,
            "sizes": [len(p) for p in parts],
            "images": [len(i) for i in images],
            "stdout_cut": stdout_cut,
            "stderr_cut": stderr_cut,
            "interrupted": interrupted,
            "figures": figures,
        }
        return header, b"".join(parts)


USER_SITE_ENABLED = False


def enable_user_site():
    """The host starts the driver with `python3 -I`, so nothing under ~/.local (a planted
    usercustomize.py or .pth) runs before the protocol is up. User code still expects
    `pip install --user` packages to import, so the user site is added right before the first
    cell runs: from then on the process runs the user's code anyway."""
    global USER_SITE_ENABLED
    if USER_SITE_ENABLED:
        return
    USER_SITE_ENABLED = True
    import site

    try:
        user_site = site.getusersitepackages()
        if os.path.isdir(user_site):
            site.addsitedir(user_site)
    except Exception:  # a broken .pth must not break the cell that follows
        pass


def listen(path):
    """The driver's socket at `path`, in the relay's private directory."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o077)
    try:
        listener.bind(path)
    finally:
        os.umask(old)  # the cells' files get the usual modes
    listener.listen(8)
    return listener


def main():
    if len(sys.argv) != 3 or sys.argv[1] != "--listen":
        sys.stderr.write("usage: sandboxd_py.py --listen SOCKET (started by sandboxd_pyrelay.py)\n")
        os._exit(2)
    sock_path = sys.argv[2]
    listener = listen(sock_path)
    sock_ino = os.stat(sock_path).st_ino
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.close(devnull)
    sys.stdout = open(os.devnull, "w")
    saved_stderr = os.dup(2)
    os.set_inheritable(saved_stderr, False)
    # A segfault in native code leaves a Python traceback on the driver's own stderr (a file
    # the relay reads back), which the host reports as the interpreter's last words.
    faulthandler.enable(file=os.fdopen(saved_stderr, "w", closefd=False), all_threads=False)
    warnings.filterwarnings("ignore", message=r".*non-interactive, and thus cannot be shown")

    # Cells run in a fresh __main__ (so pickle finds their classes) with '' on sys.path,
    # like an interactive interpreter started in /workspace.
    global DRIVER_MODULE
    DRIVER_MODULE = sys.modules["__main__"]  # keeps the driver's own globals alive
    main_module = types.ModuleType("__main__")
    main_module.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main_module
    sys.argv = [""]
    sys.path[0] = ""

    # A child forked by a cell (multiprocessing) must not hold the socket, a connection or the
    # driver's stderr: while it did, the relay would not see this interpreter die.
    Channel.private_fds.update((listener.fileno(), saved_stderr))

    def forget_channel():
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in list(Channel.private_fds):
            try:
                os.dup2(devnull, fd)
            except OSError:
                pass
        os.close(devnull)

    os.register_at_fork(after_in_child=forget_channel)

    signal.signal(signal.SIGINT, on_sigint)
    requests = queue.Queue()
    cell = Cell(main_module.__dict__, saved_stderr)
    threading.Thread(target=accept_loop, args=(listener, requests), name="sandboxd-accept", daemon=True).start()
    while True:
        try:
            gen, req, body = requests.get()
            if gen != Channel.generation:
                continue  # sent by a connection that is gone; nobody waits for it
            op = req.get("op")
            if op == "exit":
                # No new connection may reach a driver that is leaving (the path is left
                # alone if something else has taken it over since).
                try:
                    if os.stat(sock_path).st_ino == sock_ino:
                        os.unlink(sock_path)
                except OSError:
                    pass
                os._exit(0)
            if op == "execute":
                enable_user_site()
                with State.lock:
                    State.cells += 1
                try:
                    header, out = cell.run(req, body)
                except Exception as exc:  # a driver bug must not take the session's variables
                    msg = ("sandboxd driver error: %r" % exc).encode()
                    header, out = {"id": req.get("id"), "sizes": [0, 0, 0, len(msg), 0], "figures": []}, msg
            else:
                header, out = {"id": req.get("id"), "unknown_op": str(op)}, b""
            Channel.reply(header, out)
        except KeyboardInterrupt:
            continue


if __name__ == "__main__":
    main()
