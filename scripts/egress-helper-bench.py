"""The in-sandbox egress helper alone: how fast it carries a download, without Docker or sandboxd.

    python3 scripts/egress-helper-bench.py [MIB] [PORT]

Runs images/sandbox/helpers/sandboxd_egress.py on this host with pipes for its stdio and plays
the host's side of the protocol (frame.rs) as cheaply as python can: one connection, DATA
frames of MAX_PAYLOAD cut from one prebuilt buffer, within the credit the helper gives back.
A client thread on the helper's port drains the download. Prints MiB/s and the CPU seconds
the helper used (its own share of the path, BENCHMARKS.md "where the bytes' time goes").
"""
import os
import socket
import struct
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
HELPER = os.path.join(HERE, "..", "images", "sandbox", "helpers", "sandboxd_egress.py")
HEADER = struct.Struct(">IBI")
DATA, CREDIT, OPEN, HELLO = 3, 6, 2, 1
MAX_PAYLOAD = 64 * 1024
WINDOW = 256 * 1024


def read_exact(fd, n):
    out = b""
    while len(out) < n:
        b = os.read(fd, n - len(out))
        if not b:
            raise EOFError("the helper exited")
        out += b
    return out


def read_frame(fd):
    cid, kind, length = HEADER.unpack(read_exact(fd, HEADER.size))
    return cid, kind, read_exact(fd, length) if length else b""


def cpu_secs(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main():
    mib = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
    port = int(sys.argv[2]) if len(sys.argv) > 2 else 13128
    total = mib << 20
    helper = subprocess.Popen(
        [sys.executable, HELPER, "--port", str(port), "--max", "8"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )
    to_helper, from_helper = helper.stdin.fileno(), helper.stdout.fileno()
    assert read_frame(from_helper)[1] == HELLO
    got = [0]

    def client():
        s = socket.create_connection(("127.0.0.1", port))
        while True:
            b = s.recv(1 << 20)
            if not b:
                break
            got[0] += len(b)

    drain = threading.Thread(target=client)
    drain.start()
    cid, kind, _ = read_frame(from_helper)
    assert kind == OPEN, kind
    frame = memoryview(HEADER.pack(cid, DATA, MAX_PAYLOAD) + b"x" * MAX_PAYLOAD)
    cpu0, t0 = cpu_secs(helper.pid), time.perf_counter()
    credit, sent = WINDOW, 0
    while sent < total:
        while credit < MAX_PAYLOAD:
            c, kind, payload = read_frame(from_helper)
            if kind == CREDIT:
                credit += struct.unpack(">I", payload)[0]
        view = frame
        while view:
            view = view[os.write(to_helper, view):]
        credit -= MAX_PAYLOAD
        sent += MAX_PAYLOAD
    os.write(to_helper, HEADER.pack(cid, 5, 0))  # CLOSE: the helper closes the socket
    drain.join()
    secs, cpu = time.perf_counter() - t0, cpu_secs(helper.pid) - cpu0
    helper.stdin.close()
    helper.wait()
    print("%d MiB in %.2f s: %.0f MiB/s; the helper used %.2f CPU s (%.0f MiB per CPU second)"
          % (got[0] >> 20, secs, (got[0] >> 20) / secs, cpu, (got[0] >> 20) / max(cpu, 1e-9)))


if __name__ == "__main__":
    main()
