"""Runs a command that must outlive the exec that started it (Chromium of a kept session).

    sandboxd_detach.py COMMAND [ARG...]

The command runs in a session of its own with stdin and stdout on /dev/null and its stderr
on a pipe to this process, which copies it to its own stderr (the exec's, where the host
reads Chromium's DevTools announcement) for as long as someone reads it (what does not fit at once is dropped). When the host
process is gone and the copy fails, this process keeps draining the pipe into nothing, so
the command neither blocks on a full pipe nor dies of SIGPIPE. It exits with the command's
status when the pipe closes (the command and everything it started have exited), so the
exec's end still means "Chromium exited" to a host that is still there.
"""
import os
import signal
import sys


def main():
    argv = sys.argv[1:]
    if not argv:
        sys.stderr.write("usage: sandboxd_detach.py COMMAND [ARG...]\n")
        os._exit(2)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            null = os.open(os.devnull, os.O_RDWR)
            os.dup2(null, 0)
            os.dup2(null, 1)
            os.dup2(w, 2)
            os.execvp(argv[0], argv)
        finally:
            os._exit(127)
    os.close(w)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    # A reader that stops reading must not stall the copy (and with it the command): what
    # does not fit into our stderr at once is dropped.
    os.set_blocking(2, False)
    copying = True
    while True:
        try:
            data = os.read(r, 65536)
        except InterruptedError:
            continue
        if not data:
            break
        if copying:
            try:
                os.write(2, data)
            except BlockingIOError:
                pass
            except OSError:
                copying = False
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        os._exit(128 + os.WTERMSIG(status))
    os._exit(os.WEXITSTATUS(status))


if __name__ == "__main__":
    main()
