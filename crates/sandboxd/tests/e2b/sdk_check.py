"""Drives sandboxd's E2B-compatible API with the unmodified E2B SDKs from PyPI, used as their
documentation shows. Run by tests/e2b_sdk.rs against a real `sandboxd serve`:

    sdk_check.py MODE

with E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY set. Prints one JSON object of what it saw;
the Rust test asserts on it (a failure inside raises and exits non-zero with the traceback).
"""
import json
import os
import sys
import threading
import time

import e2b
from e2b import Sandbox
from e2b import CommandExitException
import e2b_code_interpreter
import httpx


def commands_and_files():
    out = {}
    sbx = Sandbox.create(metadata={"suite": "e2b-sdk"}, envs={"SESSION_VAR": "from-create"})
    out["sandbox_id"] = sbx.sandbox_id
    r = sbx.commands.run("echo hi")
    out["echo"] = {"stdout": r.stdout, "exit_code": r.exit_code}
    chunks = []
    sbx.commands.run("for i in 1 2 3; do echo line$i; sleep 0.2; done", on_stdout=chunks.append)
    out["streamed"] = chunks
    try:
        sbx.commands.run("echo oops >&2; exit 3")
        out["exit3"] = None
    except CommandExitException as e:
        out["exit3"] = {"exit_code": e.exit_code, "stderr": e.stderr}
    out["session_env"] = sbx.commands.run("echo $SESSION_VAR").stdout

    # Two background processes and a foreground command at once; env and cwd reach them.
    sbx.files.make_dir("/workspace/wd")
    bg1 = sbx.commands.run(
        "echo $WHO > bg1.txt; pwd >> bg1.txt; sleep 30",
        background=True, envs={"WHO": "first"}, cwd="/workspace/wd",
    )
    bg2 = sbx.commands.run("sleep 30", background=True)
    fg = sbx.commands.run("echo $WHO-$PWD", envs={"WHO": "fg"}, cwd="/tmp")
    out["fg_while_bg"] = fg.stdout
    running = [p.pid for p in sbx.commands.list()]
    out["listed"] = sorted(running)
    out["bg_pids"] = sorted([bg1.pid, bg2.pid])
    time.sleep(0.5)
    out["bg1_file"] = sbx.files.read("/workspace/wd/bg1.txt")
    out["killed"] = [sbx.commands.kill(bg1.pid), bg2.kill()]
    out["kill_missing"] = sbx.commands.kill(999999)
    out["after_kill"] = [p.pid for p in sbx.commands.list()]

    # stdin
    cat = sbx.commands.run("cat", background=True, stdin=True)
    sbx.commands.send_stdin(cat.pid, "typed\n")
    sbx.commands.close_stdin(cat.pid)
    out["stdin_echo"] = cat.wait().stdout

    # files
    sbx.files.write("notes.txt", "hello text")
    sbx.files.write("/workspace/blob.bin", b"\x00\x01\x02\xff")
    out["text"] = sbx.files.read("notes.txt")
    out["bytes"] = list(sbx.files.read("/workspace/blob.bin", format="bytes"))
    sbx.files.write_files([
        {"path": "/workspace/multi/a.txt", "data": "A"},
        {"path": "/workspace/multi/b.txt", "data": "B"},
    ])
    out["multi"] = sorted(e.name for e in sbx.files.list("/workspace/multi"))
    out["make_dir"] = [sbx.files.make_dir("/workspace/newdir"), sbx.files.make_dir("/workspace/newdir")]
    out["list_depth2"] = sorted(e.path for e in sbx.files.list("/workspace/multi", depth=2))
    info = sbx.files.rename("/workspace/notes.txt", "/workspace/renamed.txt")
    out["renamed"] = info.path
    out["exists"] = [sbx.files.exists("/workspace/renamed.txt"), sbx.files.exists("/workspace/notes.txt")]
    sbx.files.remove("/workspace/newdir")
    out["removed"] = not sbx.files.exists("/workspace/newdir")
    try:
        sbx.files.read("/workspace/missing.txt")
        out["missing"] = None
    except Exception as e:
        out["missing"] = type(e).__name__
    # A script uploaded, made executable, run.
    sbx.files.write("/workspace/run.sh", "#!/bin/sh\necho ran-script\n")
    sbx.commands.run("chmod 0755 /workspace/run.sh")
    out["script"] = sbx.commands.run("./run.sh", cwd="/workspace").stdout

    # No network.
    try:
        r = sbx.commands.run("curl -sS --max-time 5 https://example.com")
        out["curl_exit"] = r.exit_code
    except CommandExitException as e:
        out["curl_exit"] = e.exit_code

    out["info_metadata"] = sbx.get_info().metadata
    listed = Sandbox.list(query=e2b.SandboxQuery(metadata={"suite": "e2b-sdk"})).next_items()
    out["list_ids"] = [s.sandbox_id for s in listed]
    out["list_none"] = len(Sandbox.list(query=e2b.SandboxQuery(metadata={"suite": "nope"})).next_items())
    sbx.set_timeout(120)
    same = Sandbox.connect(sbx.sandbox_id)
    out["connected"] = same.commands.run("echo again").stdout
    out["is_running"] = sbx.is_running()
    out["kill"] = sbx.kill()
    out["kill_again"] = Sandbox.kill(sbx.sandbox_id)
    return out


def refused():
    out = {}
    try:
        Sandbox.create(template="no-such-template")
        out["template"] = None
    except Exception as e:
        out["template"] = f"{type(e).__name__}: {e}"
    try:
        Sandbox.create(allow_internet_access=True)
        out["internet"] = None
    except Exception as e:
        out["internet"] = f"{type(e).__name__}: {e}"
    return out


def code_interpreter():
    out = {}
    sbx = e2b_code_interpreter.Sandbox.create(envs={"CI_VAR": "in-python"})
    out["sandbox_id"] = sbx.sandbox_id
    out["env_in_python"] = sbx.run_code("import os; os.environ.get('CI_VAR')").text
    sbx.run_code("x = 41")
    ex = sbx.run_code("x + 1")
    out["result"] = ex.text
    out["count"] = ex.execution_count
    ex = sbx.run_code("print('out'); import sys; print('err', file=sys.stderr)")
    out["logs"] = {"stdout": ex.logs.stdout, "stderr": ex.logs.stderr}
    ex = sbx.run_code(
        "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
        "plt.plot([1, 2, 3], [1, 4, 9])\n"
    )
    pngs = [r.png for r in ex.results if r.png]
    out["png_prefix"] = pngs[0][:12] if pngs else None
    ex = sbx.run_code("1 / 0")
    out["error"] = {
        "name": ex.error.name if ex.error else None,
        "value": ex.error.value if ex.error else None,
        "traceback": ex.error.traceback if ex.error else None,
    }
    try:
        sbx.run_code("console.log(1)", language="javascript")
        out["js"] = None
    except Exception as e:
        out["js"] = f"{type(e).__name__}: {e}"
    out["contexts"] = [c.id for c in sbx.list_code_contexts()]
    out["live"] = live_output(sbx)
    out.update(code_contexts(sbx))
    sbx.kill()
    return out


def live_output(sbx):
    """A cell that prints then sleeps, five times: when each on_stdout callback fired (this
    process's clock) beside what the cell printed (its own clock at each print)."""
    seen = []
    code = (
        "import time\n"
        "for i in range(5):\n"
        "    print('tick', i, repr(time.time()))\n"
        "    time.sleep(0.5)\n"
    )
    ex = sbx.run_code(code, on_stdout=lambda m: seen.append([time.time(), m.line]))
    # Past the output cap (256 KiB per stream): the head live, then a marker and the tail.
    big = "".join(sbx.run_code("print('a' * 300000); print('b' * 300000)").logs.stdout)
    # A caller that gives up (the SDK's timeout) interrupts the cell: the next one runs at
    # once, and the variables are kept.
    started = time.time()
    try:
        sbx.run_code("import time; time.sleep(60)", timeout=1)
        left = None
    except Exception as e:
        left = type(e).__name__
    after = sbx.run_code("x").text
    return {
        "left": [left, after, time.time() - started],
        "callbacks": seen,
        "stdout": "".join(ex.logs.stdout),
        "big": [
            len(big),
            len(big) - len(big.lstrip("a")),
            len(big.rstrip("\n")) - len(big.rstrip("\n").rstrip("b")),
            "bytes cut by sandboxd" in big,
        ],
    }


def code_contexts(sbx):
    """A created context is a separate interpreter: its own variables and cwd; listed,
    restarted, removed (its interpreter is gone); at most 8."""
    out = {}
    ctx = sbx.create_code_context(cwd="/tmp")
    out["ctx_cwd"] = ctx.cwd
    out["ctx_sees_x"] = sbx.run_code("'x' in globals()", context=ctx).text
    sbx.run_code("y = 7", context=ctx)
    out["ctx_y"] = sbx.run_code("y * 6", context=ctx).text
    out["ctx_getcwd"] = sbx.run_code("import os; os.getcwd()", context=ctx).text
    out["default_sees_y"] = sbx.run_code("'y' in globals()").text
    out["listed"] = [[c.id == ctx.id, c.cwd] for c in sbx.list_code_contexts()]
    sbx.restart_code_context(ctx)
    out["ctx_y_after_restart"] = sbx.run_code("'y' in globals()", context=ctx).text
    out["default_x_after"] = sbx.run_code("x").text
    pid = sbx.run_code("import os; os.getpid()", context=ctx).text
    out["pids_differ"] = pid != sbx.run_code("import os; os.getpid()").text
    sbx.remove_code_context(ctx)
    out["ctx_pid_gone"] = sbx.run_code(
        "import os, time\n"
        "def alive(pid):\n"
        "    try:\n"
        "        with open('/proc/%d/stat' % pid) as f:\n"
        "            return f.read().rsplit(')', 1)[1].split()[0] != 'Z'\n"
        "    except FileNotFoundError:\n"
        "        return False\n"
        "for _ in range(30):\n"
        "    if not alive(PID):\n"
        "        break\n"
        "    time.sleep(0.1)\n"
        "not alive(PID)".replace("PID", pid)
    ).text
    try:
        sbx.run_code("1", context=ctx)
        out["removed_run"] = None
    except Exception as e:
        out["removed_run"] = type(e).__name__
    out["listed_after_remove"] = [c.id for c in sbx.list_code_contexts()]
    made = [sbx.create_code_context() for _ in range(8)]
    try:
        sbx.create_code_context()
        out["ninth"] = None
    except Exception as e:
        out["ninth"] = f"{type(e).__name__}: {e}"
    out["eighth_runs"] = sbx.run_code("import os; os.getcwd()", context=made[-1]).text
    return out


def foreign():
    """As user B: user A's sandbox (SANDBOX_ID) is not found, and not listed."""
    out = {}
    victim = os.environ["SANDBOX_ID"]
    try:
        Sandbox.connect(victim)
        out["connect"] = None
    except Exception as e:
        out["connect"] = type(e).__name__
    out["kill"] = Sandbox.kill(victim)
    out["listed"] = [s.sandbox_id for s in Sandbox.list().next_items()]
    # An in-sandbox call with A's id and B's key, as the SDK would send it.
    r = httpx.post(
        os.environ["E2B_SANDBOX_URL"] + "/process.Process/List",
        json={},
        headers={"E2b-Sandbox-Id": victim, "E2b-Sandbox-Port": "49983",
                 "X-Access-Token": os.environ["E2B_API_KEY"]},
    )
    out["forged_list"] = [r.status_code, r.json().get("code")]
    return out


def template():
    """A sandbox from the admin's template `jq` (TEMPLATE names it), and an unknown one."""
    out = {}
    sbx = Sandbox.create(template=os.environ["TEMPLATE"])
    out["jq"] = sbx.commands.run("echo '{\"a\": 41}' | jq '.a + 1'").stdout
    out["template_id"] = sbx.get_info().template_id
    out["listed_template"] = [s.template_id for s in Sandbox.list().next_items()]
    out["sandbox_id"] = sbx.sandbox_id
    sbx.kill()
    try:
        Sandbox.create(template="no-such-template")
        out["unknown"] = None
    except Exception as e:
        out["unknown"] = f"{type(e).__name__}: {e}"
    return out


def pause():
    """A sandbox with a file, paused: the state E2B shows, and what a pause refuses."""
    out = {}
    sbx = Sandbox.create(metadata={"suite": "pause"})
    out["sandbox_id"] = sbx.sandbox_id
    sbx.files.write("/workspace/kept.txt", "kept across a pause")
    sbx.commands.run("echo hi > /tmp/lost.txt")
    out["paused"] = sbx.pause()
    out["pause_again"] = Sandbox.pause(sbx.sandbox_id)
    try:
        Sandbox.pause(sbx.sandbox_id, mode="full")
        out["full"] = None
    except Exception as e:
        out["full"] = f"{type(e).__name__}: {e}"
    out["state"] = str(sbx.get_info().state)
    by_state = lambda st: [
        s.sandbox_id
        for s in Sandbox.list(query=e2b.SandboxQuery(metadata={"suite": "pause"}, state=st)).next_items()
    ]
    out["listed_paused"] = by_state([e2b.SandboxState.PAUSED])
    out["listed_running"] = by_state([e2b.SandboxState.RUNNING])
    out["listed_any"] = by_state(None)
    # Not running, and asking does not resume it.
    out["is_running"] = sbx.is_running()
    out["state_after_probe"] = str(sbx.get_info().state)
    return out


def resume():
    """Connects to the paused sandbox SANDBOX_ID (resumed with its files), uses it, pauses
    it again and uses it without connecting (resumed by the call, as E2B's auto-resume)."""
    out = {}
    sbx = Sandbox.connect(os.environ["SANDBOX_ID"])
    out["state"] = str(sbx.get_info().state)
    out["file"] = sbx.files.read("/workspace/kept.txt")
    out["tmp_kept"] = sbx.files.exists("/tmp/lost.txt")
    out["echo"] = sbx.commands.run("echo back").stdout
    out["connect_running"] = str(Sandbox.connect(sbx.sandbox_id).get_info().state)
    out["paused_again"] = sbx.pause()
    out["auto_resumed"] = sbx.commands.run("cat /workspace/kept.txt").stdout
    out["state_after"] = str(sbx.get_info().state)
    return out


def timeout():
    """set_timeout longer and shorter than the sandbox was made with, above the admin's cap,
    and on a paused sandbox: the end time get_info shows, in seconds from before and after
    each call."""
    from datetime import datetime, timezone

    def end_after(set_to, sbx):
        before = datetime.now(timezone.utc)
        sbx.set_timeout(set_to)
        info = sbx.get_info()
        after = datetime.now(timezone.utc)
        return [(info.end_at - before).total_seconds(), (info.end_at - after).total_seconds()]

    out = {}
    sbx = Sandbox.create(timeout=60)
    out["sandbox_id"] = sbx.sandbox_id
    out["longer"] = end_after(300, sbx)
    out["shorter"] = end_after(30, sbx)
    out["above_cap"] = end_after(10**6, sbx)
    sbx.pause()
    out["paused"] = end_after(120, sbx)
    out["paused_state"] = str(sbx.get_info().state)
    out["connect_longer"] = str(Sandbox.connect(sbx.sandbox_id, timeout=200).get_info().state)
    return out


def keep():
    """Creates a sandbox and leaves it running; prints its id."""
    sbx = Sandbox.create()
    return {"sandbox_id": sbx.sandbox_id}


MODES = {
    "commands_and_files": commands_and_files,
    "refused": refused,
    "code_interpreter": code_interpreter,
    "foreign": foreign,
    "keep": keep,
    "template": template,
    "pause": pause,
    "resume": resume,
    "timeout": timeout,
}

if __name__ == "__main__":
    print(json.dumps(MODES[sys.argv[1]]()))
