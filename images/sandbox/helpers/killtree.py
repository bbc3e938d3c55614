"""Kills process trees inside the sandbox: by SANDBOXD_TAG in the environment, or by ancestor.

    killtree.py --tag TAG            every process whose environment holds SANDBOXD_TAG=TAG
    killtree.py --descendants PID    every descendant of PID (PID itself survives)
    killtree.py --tree PID           PID and all its descendants

Processes are stopped first, then killed, and the scan repeats until nothing matches, so
a process that forks while being killed does not escape. Zombies are already dead and are
not counted. The exit status is the host's proof: 0 only when a final scan finds no live
target left (3 otherwise, with the survivors' pids on stderr), so the host never reports a
kill that did not happen.

The host starts this as `python3 -I` with a fixed PATH: nothing sandboxed code can write
(~/.local site-packages, usercustomize, PYTHON* variables) is imported or read.
"""
import os
import signal
import sys
import time


def processes():
    """pid -> (ppid, state) for every process visible in /proc."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as f:
                data = f.read()
            fields = data[data.rindex(b")") + 2:].split()
            table[int(name)] = (int(fields[1]), fields[0])
        except (OSError, ValueError, IndexError):
            pass
    return table


def has_tag(pid, needle):
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            return needle in f.read().split(b"\0")
    except OSError:
        return False


def closure(table, roots):
    children = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, stack = set(), list(roots)
    while stack:
        pid = stack.pop()
        for child in children.get(pid, []):
            if child not in out:
                out.add(child)
                stack.append(child)
    return out


def targets(mode, arg):
    me = os.getpid()
    table = processes()
    if mode == "--tag":
        needle = ("SANDBOXD_TAG=" + arg).encode()
        roots = {p for p in table if p != me and has_tag(p, needle)}
        found = roots | closure(table, roots)
    elif mode == "--descendants":
        found = closure(table, {int(arg)})
    else:
        found = {int(arg)} | closure(table, {int(arg)})
    found.discard(me)
    found.discard(1)
    # A zombie is dead already; it only waits for its parent to reap it.
    return {p for p in found if p in table and table[p][1] != b"Z"}


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("--tag", "--descendants", "--tree"):
        sys.stderr.write(__doc__)
        return 2
    mode, arg = sys.argv[1], sys.argv[2]
    killed = 0
    for _ in range(50):
        found = targets(mode, arg)
        if not found:
            break
        for pid in found:
            try:
                os.kill(pid, signal.SIGSTOP)
            except OSError:
                pass
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except OSError:
                pass
    # Proof, not hope: the last round may have killed something; look again after a moment.
    survivors = set()
    for _ in range(40):
        survivors = targets(mode, arg)
        if not survivors:
            break
        time.sleep(0.05)
    print(killed)
    if survivors:
        sys.stderr.write("still running: %s\n" % " ".join(map(str, sorted(survivors))))
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
