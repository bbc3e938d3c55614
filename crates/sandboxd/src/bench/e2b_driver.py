"""The E2B SDK's side of `sandboxd bench e2b` (crates/sandboxd/src/bench/e2b.rs): reads one
command a line on stdin and answers one JSON line on stdout, so the Rust side interleaves each
measurement with the same operation through /v1 and waits for a full warm pool between creates.

    create  Sandbox.create() then commands.run("true"), timed; then kill() (not timed)
    open    a code-interpreter sandbox kept for `run` and `code`
    run     commands.run("true") in it, timed
    code    run_code("1+1") in it, timed (its text must be "2")
    close   kill() it

E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY point the unmodified SDKs at the server.
"""
import json
import sys
import time

from e2b_code_interpreter import Sandbox


def main():
    sbx = None
    for line in sys.stdin:
        cmd = line.strip()
        try:
            if cmd == "create":
                t = time.perf_counter()
                fresh = Sandbox.create()
                fresh.commands.run("true")
                ms = (time.perf_counter() - t) * 1e3
                fresh.kill()
                answer = {"ms": ms}
            elif cmd == "open":
                sbx = Sandbox.create()
                answer = {"id": sbx.sandbox_id}
            elif cmd == "run":
                t = time.perf_counter()
                sbx.commands.run("true")
                answer = {"ms": (time.perf_counter() - t) * 1e3}
            elif cmd == "code":
                t = time.perf_counter()
                ex = sbx.run_code("1+1")
                ms = (time.perf_counter() - t) * 1e3
                if ex.text != "2":
                    raise RuntimeError(f"run_code('1+1') gave {ex.text!r}")
                answer = {"ms": ms}
            elif cmd == "close":
                if sbx is not None:
                    sbx.kill()
                answer = {}
            else:
                answer = {"error": f"unknown command {cmd!r}"}
        except Exception as e:  # reported to the Rust side, which stops
            answer = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
