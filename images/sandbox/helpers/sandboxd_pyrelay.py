"""sandboxd python relay: connects one sandboxd process to the session's python driver.

The driver (sandboxd_py.py --listen) is a daemon of the container, not a child of any exec,
so its variables outlive the sandboxd process that started it: a later `sandboxd run
--session ID` reaches the same interpreter. Each sandboxd process runs this relay through
one exec and speaks the driver's frames over the relay's stdin/stdout; the relay only copies
bytes (the host checks every frame, as before).

    sandboxd_pyrelay.py [--context ID [--cwd DIR]]
        find the running driver or start one, then relay until either side ends

Without --context it is the session's interpreter (the python tool's, E2B's default
context); with one, a separate interpreter of that code context (its own socket, status and
last words in the same directory, named after ID: [a-z0-9]{1,32}), started in DIR.

The driver's socket lives in a private directory (/tmp/sandboxd-py, mode 0700, owned by the
sandbox user); a directory that is anything else is refused, not repaired. Finding or
starting the driver is serialised by a lock file, so two relays never start two drivers.
A started driver runs under /bin/sh as its keeper, which records its exit status in
`status` (the shell convention: 128 + signal), and its stderr (faulthandler's report of a
crash) goes to `driver.err`.

Exit status, which the host reads:
    0   the host closed stdin
    75  the driver closed the connection but still runs
    76  the driver could not be reached or started (stderr says why)
    77  the driver exited: stderr holds the end of its stderr, then the line
        "sandboxd_pyrelay: the interpreter exited with status N"
    anything else: the relay itself died (it was killed)
"""
import errno
import fcntl
import os
import select
import socket
import stat
import sys
import time

DIR = "/tmp/sandboxd-py"
SOCK = DIR + "/sock"
STATUS = DIR + "/status"
ERR = DIR + "/driver.err"
LOCK = DIR + "/lock"
CWD = "/workspace"
HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON = "/usr/bin/python3"
START_TIMEOUT = 20.0
LAST_WORDS = 4096


def fail(code, message):
    try:
        os.write(2, ("sandboxd_pyrelay: %s\n" % message).encode())
    except OSError:
        pass
    os._exit(code)


def private_dir():
    try:
        os.mkdir(DIR, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        fail(76, "cannot create %s: %s" % (DIR, e))
    st = os.lstat(DIR)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) != 0o700:
        fail(
            76,
            "%s is not a private directory of this user (mode 0700); remove it (rm -rf %s) "
            "and call python again" % (DIR, DIR),
        )


def connect():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(SOCK)
        return s
    except OSError:
        s.close()
        return None


def start_driver():
    for stale in (SOCK, STATUS):
        try:
            os.unlink(stale)
        except FileNotFoundError:
            pass
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            if os.fork() != 0:
                os._exit(0)
            # The keeper: a shell that waits for the driver and records how it ended. fds
            # other than 0-2 are close-on-exec, so the lock and the pipes to the host stay here.
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.chdir(CWD)
            script = '("$0" -I -u "$1" --listen "$2") 2>"$3"; echo $? >"$4.new" && mv -f "$4.new" "$4"'
            os.execv(
                "/bin/sh",
                ["sh", "-c", script, PYTHON, HERE + "/sandboxd_py.py", SOCK, ERR, STATUS],
            )
        finally:
            os._exit(127)
    os.waitpid(pid, 0)
    until = time.monotonic() + START_TIMEOUT
    while time.monotonic() < until:
        s = connect()
        if s is not None:
            return s
        if os.path.exists(STATUS):
            break
        time.sleep(0.005)
    report_exit(0.0)
    fail(76, "the python driver did not start within %ds" % START_TIMEOUT)


def report_exit(wait):
    """Exits 77 with the driver's last words and status, if it has exited (waiting up to `wait`)."""
    until = time.monotonic() + wait
    while True:
        try:
            with open(STATUS, "rb") as f:
                status = int(f.read(32).strip() or b"-1")
            break
        except (OSError, ValueError):
            if time.monotonic() >= until:
                return
            time.sleep(0.02)
    words = b""
    try:
        with open(ERR, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - LAST_WORDS))
            words = f.read(LAST_WORDS)
    except OSError:
        pass
    try:
        if words:
            os.write(2, words.rstrip(b"\n") + b"\n")
        os.write(2, b"sandboxd_pyrelay: the interpreter exited with status %d\n" % status)
    except OSError:
        pass
    os._exit(77)


def find_or_start():
    private_dir()
    lock = os.open(LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        s = connect()
        return s if s is not None else start_driver()
    finally:
        os.close(lock)


def write_all(fd, data):
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def relay(s):
    s.setblocking(True)
    sock_fd = s.fileno()
    while True:
        try:
            ready, _, _ = select.select([0, sock_fd], [], [], 0.5)
        except InterruptedError:
            continue
        if not ready and os.path.exists(STATUS):
            # The driver died but a process it forked still holds the socket open.
            report_exit(0.0)
        if 0 in ready:
            data = os.read(0, 65536)
            if not data:
                os._exit(0)
            try:
                s.sendall(data)
            except OSError:
                report_exit(2.0)
                os._exit(75)
        if sock_fd in ready:
            try:
                data = s.recv(65536)
            except OSError as e:
                if e.errno == errno.EINTR:
                    continue
                data = b""
            if not data:
                report_exit(2.0)
                fail(75, "the python interpreter closed the connection")
            try:
                write_all(1, data)
            except OSError:
                os._exit(0)


def parse_args(args):
    """Points the paths at a context's own files when --context names one."""
    global SOCK, STATUS, ERR, LOCK, CWD
    if not args:
        return
    if len(args) not in (2, 4) or args[0] != "--context" or (len(args) == 4 and args[2] != "--cwd"):
        fail(2, "usage: sandboxd_pyrelay.py [--context ID [--cwd DIR]]")
    ctx = args[1]
    if not (0 < len(ctx) <= 32 and all(c in "abcdefghijklmnopqrstuvwxyz0123456789" for c in ctx)):
        fail(2, "a context id is 1 to 32 characters of [a-z0-9]")
    SOCK, STATUS, ERR, LOCK = ["%s/%s-%s" % (DIR, name, ctx) for name in ("sock", "status", "err", "lock")]
    if len(args) == 4:
        CWD = args[3]
        if not os.path.isdir(CWD):
            fail(76, "the context's working directory %s is not a directory" % CWD)


def main():
    parse_args(sys.argv[1:])
    relay(find_or_start())


if __name__ == "__main__":
    main()
