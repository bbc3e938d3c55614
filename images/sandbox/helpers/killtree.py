"""Kills process trees inside the sandbox: by SANDBOXD_TAG in the environment, or by ancestor.

    killtree.py --tag TAG            every process whose environment holds SANDBOXD_TAG=TAG
    killtree.py --descendants PID    every descendant of PID (PID itself survives)
    killtree.py --tree PID           PID and all its descendants

Processes are stopped first, then killed, and the scan repeats until nothing matches, so
a process that forks while being killed does not escape.
"""
import os
import signal
import sys


def processes():
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as f:
                data = f.read()
            ppid = int(data[data.rindex(b")") + 2:].split()[1])
            table[int(name)] = ppid
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
    for pid, ppid in table.items():
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
    return found


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
    print(killed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
