"""Drives the code interpreter's contexts across two sandboxd replicas with the unmodified
`e2b-code-interpreter` SDK from PyPI. Run by tests/e2b_contexts.rs, one step per run, each
against the replica E2B_API_URL and E2B_SANDBOX_URL name:

    contexts_check.py STEP

STATE (JSON) holds what earlier steps printed (the sandbox's and the contexts' ids). Prints
one JSON object of what it saw; the Rust test asserts on it (a failure inside raises and
exits non-zero with the traceback).
"""
import json
import os
import sys

import httpx
from e2b_code_interpreter import Sandbox
from e2b_code_interpreter.models import Context

STATE = json.loads(os.environ.get("STATE", "{}"))


def sandbox():
    return Sandbox.connect(STATE["sandbox_id"])


def ctx(name):
    return Context(STATE[name], "python", "")


def failure(call):
    try:
        call()
        return None
    except Exception as e:
        return f"{type(e).__name__}: {e}"


def ran(ex):
    """What one execution showed: its main text, its stderr lines and its error's name."""
    return {
        "text": ex.text,
        "stderr": ex.logs.stderr,
        "error": ex.error.name if ex.error else None,
    }


def ids(sbx):
    return [c.id for c in sbx.list_code_contexts()]


def a1():
    """Replica A: a sandbox, a context in /tmp with a variable, three more contexts."""
    sbx = Sandbox.create()
    c1 = sbx.create_code_context(cwd="/tmp")
    sbx.run_code("v = 41", context=c1)
    c2, c3, c4 = [sbx.create_code_context() for _ in range(3)]
    sbx.run_code("w = 1", context=c2)
    return {"sandbox_id": sbx.sandbox_id, "c1": c1.id, "c2": c2.id, "c3": c3.id, "c4": c4.id}


def b1():
    """Replica B: A's contexts listed and used with their variables; one restarted; the
    cap filled here, the ninth refused."""
    sbx = sandbox()
    out = {"listed": [[c.id, c.cwd] for c in sbx.list_code_contexts()]}
    listed = {c.id: c for c in sbx.list_code_contexts()}
    out["v"] = ran(sbx.run_code("v + 1", context=listed[STATE["c1"]]))
    out["getcwd"] = sbx.run_code("import os; os.getcwd()", context=ctx("c1")).text
    sbx.restart_code_context(STATE["c2"])
    out["w_after_restart"] = ran(sbx.run_code("'w' in globals()", context=ctx("c2")))
    out["made"] = [sbx.create_code_context().id for _ in range(4)]
    out["ninth"] = failure(sbx.create_code_context)
    return out


def a2():
    """Replica A: the cap B filled holds here; A uses the context B used last."""
    sbx = sandbox()
    out = {"ninth": failure(sbx.create_code_context)}
    out["v"] = ran(sbx.run_code("v", context=ctx("c1")))
    sbx.run_code("z = 5", context=ctx("c3"))
    return out


def b2():
    """Replica B: removes A's first context (its interpreter's files go too)."""
    sbx = sandbox()
    sbx.remove_code_context(STATE["c1"])
    out = {"listed": ids(sbx)}
    out["files"] = sbx.commands.run("ls -a /tmp/sandboxd-py").stdout.split()
    out["removed_run"] = failure(lambda: sbx.run_code("1", context=ctx("c1")))
    out["remove_again"] = failure(lambda: sbx.remove_code_context(STATE["c1"]))
    return out


def a3():
    """Replica A: the removal is seen here; the freed place is taken here; then a pause."""
    sbx = sandbox()
    out = {"listed": ids(sbx)}
    out["removed_run"] = failure(lambda: sbx.run_code("1", context=ctx("c1")))
    out["made"] = sbx.create_code_context().id
    out["paused"] = sbx.pause()
    return out


def a4():
    """Replica A: resumes the paused sandbox (its snapshot is in A's data directory)."""
    sbx = sandbox()
    return {"state": str(sbx.get_info().state)}


def b3():
    """Replica B, after the resume: the contexts are still there, their variables not,
    and the first execution in one says so (once)."""
    sbx = sandbox()
    out = {"listed": ids(sbx)}
    out["z"] = ran(sbx.run_code("'z' in globals()", context=ctx("c3")))
    out["z_again"] = ran(sbx.run_code("z = 6; z", context=ctx("c3")))
    out["c4"] = ran(sbx.run_code("import os; os.getcwd()", context=ctx("c4")))
    out["default"] = ran(sbx.run_code("1 + 1"))
    return out


def listing():
    return {"listed": ids(sandbox())}


def foreign():
    """Another user: A's context ids in their own sandbox are unknown, and A's sandbox's
    contexts answer as a sandbox that does not exist."""
    own = Sandbox.create()
    out = {
        "run": failure(lambda: own.run_code("1", context=ctx("c3"))),
        "remove": failure(lambda: own.remove_code_context(STATE["c3"])),
        "restart": failure(lambda: own.restart_code_context(STATE["c3"])),
        "own_listed": ids(own),
    }
    def raw(method, path, sandbox_id):
        r = httpx.request(
            method,
            os.environ["E2B_SANDBOX_URL"] + path,
            headers={"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": "49999",
                     "X-Access-Token": os.environ["E2B_API_KEY"]},
        )
        return [r.status_code, r.text]
    victim = STATE["sandbox_id"]
    out["list_victim"] = raw("GET", "/contexts", victim)
    out["list_missing"] = raw("GET", "/contexts", "no-such-sandbox")
    out["remove_victim"] = raw("DELETE", "/contexts/" + STATE["c3"], victim)
    own.kill()
    return out


STEPS = {"a1": a1, "b1": b1, "a2": a2, "b2": b2, "a3": a3, "a4": a4, "b3": b3, "foreign": foreign,
         "listing": listing}

if __name__ == "__main__":
    print(json.dumps(STEPS[sys.argv[1]]()))
