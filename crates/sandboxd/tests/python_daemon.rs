//! The python interpreter as a daemon of the container, reached through an in-sandbox relay,
//! against the real engine and image: a second connection (what a later sandboxd process
//! opens) finds the same interpreter; the newest connection takes over; a relay that dies
//! mid-call is a clear observation and the interpreter is kept; a sandbox process that
//! replaces the driver's socket with its own server (flooding frames or lying about sizes)
//! cannot hang the host or make it allocate.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use sandboxd_core::sandbox::{ExecRequest, Sandbox};
use sandboxd_core::tools::python::Python;
use sandboxd_core::tools::{Tool, ToolContext, ToolResult};
use serde_json::json;

/// A python tool over `sandbox`: what one sandboxd process holds.
fn connection(sandbox: Arc<dyn Sandbox>) -> Python {
    Python::new(
        sandbox,
        Duration::from_secs(30),
        Duration::from_secs(60),
        64 * 1024,
    )
}

async fn run(p: &Python, code: &str) -> ToolResult {
    run_with(p, json!({ "code": code })).await
}

async fn run_with(p: &Python, args: serde_json::Value) -> ToolResult {
    // Every call must end well within this, whatever the sandbox does.
    tokio::time::timeout(
        Duration::from_secs(90),
        p.execute(args, &ToolContext::default()),
    )
    .await
    .expect("the python call hung")
    .expect("python call")
}

fn ok(r: &ToolResult) -> &str {
    assert!(!r.is_error(), "unexpected error: {}", r.render());
    &r.output
}

#[tokio::test]
async fn a_second_connection_finds_the_same_interpreter_and_the_newest_wins() {
    let m = support::manager().await;
    let (s, _guard) = support::session(&m).await;
    let first = connection(s.sandbox.clone());
    ok(&run(&first, "x = 41").await);
    drop(first);
    let second = connection(s.sandbox.clone());
    assert_eq!(ok(&run(&second, "x + 1").await), "42");

    // A third connection while the second is still open takes over; the second is told.
    let third = connection(s.sandbox.clone());
    assert_eq!(ok(&run(&third, "x").await), "41");
    let r = run(&second, "x").await;
    let err = r.error.as_deref().unwrap_or_default();
    assert!(err.contains("another sandboxd process"), "{}", r.render());
    assert!(err.contains("variables are kept"), "{err}");
    // Being taken over did not cost the interpreter: the third still has it, and the
    // second gets it back on its next call.
    assert_eq!(ok(&run(&third, "x").await), "41");
    assert_eq!(ok(&run(&second, "x * 2").await), "82");
}

#[tokio::test]
async fn the_relay_dying_mid_call_is_reported_and_the_interpreter_is_kept() {
    let m = support::manager().await;
    let (s, _guard) = support::session(&m).await;
    let p = connection(s.sandbox.clone());
    ok(&run(&p, "kept = 'still here'").await);
    let r = run(
        &p,
        "import os, signal, time
for pid in os.listdir('/proc'):
    if pid.isdigit():
        try:
            cmd = open('/proc/%s/cmdline' % pid, 'rb').read()
        except OSError:
            continue
        if b'sandboxd_pyrelay' in cmd:
            os.kill(int(pid), signal.SIGKILL)
time.sleep(1)
print('after')",
    )
    .await;
    let err = r.error.as_deref().expect("a lost connection is an error");
    assert!(
        err.contains("connection to the python interpreter was lost")
            && err.contains("killed by signal 9"),
        "{err}"
    );
    assert!(!err.contains("died"), "{err}");
    let r = run(&p, "kept").await;
    assert_eq!(ok(&r), "'still here'");
    assert!(r.system.is_none(), "{:?}", r.system);
}

/// Started by a cell: takes the driver's socket path over with a server of its own. Each
/// connection gets `mode`'s treatment: "huge" announces a 4 GB frame, "flood" sends a valid
/// hello and then frames of other cells without end.
const FAKE_SERVER: &str = r#"
import json, os, socket, struct, sys
mode = sys.argv[1]
path = "/tmp/sandboxd-py/sock"
def frame(h, body=b""):
    h = json.dumps(h).encode()
    return b"SBX1" + struct.pack(">I", len(h)) + h + struct.pack(">I", len(body)) + body
os.unlink(path)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(path)
s.listen(8)
open("/tmp/fake.pid", "w").write(str(os.getpid()))
open("/tmp/fake-ready", "w").close()
me = os.getpid()
while True:
    c, _ = s.accept()
    if os.fork() == 0:
        try:
            if mode == "huge":
                c.sendall(b"SBX1" + struct.pack(">I", 2) + b"{}" + struct.pack(">I", 0xFFFFFFF0))
                c.sendall(b"A" * (1 << 20))
            else:
                c.sendall(frame({"hello": "sandboxd_py", "pid": me, "last_id": 0, "running": None, "cells": 1}))
                junk = frame({"id": 999999, "sizes": [0, 0, 0, 0, 0]})
                while True:
                    c.sendall(junk * 256)
        except OSError:
            pass
        os._exit(0)
    c.close()
"#;

async fn plant_fake_server(p: &Python, mode: &str) {
    let code = format!(
        "import subprocess, os, time\nopen('/tmp/fake.py', 'w').write({FAKE_SERVER:?})\n\
         subprocess.Popen(['python3', '/tmp/fake.py', '{mode}'], start_new_session=True)\n\
         while not os.path.exists('/tmp/fake-ready'):\n    time.sleep(0.05)\nos.remove('/tmp/fake-ready')\nprint('planted')"
    );
    assert_eq!(ok(&run(p, &code).await), "planted");
}

#[tokio::test]
async fn a_hostile_server_on_the_drivers_socket_cannot_hang_or_flood_the_host() {
    let m = support::manager().await;
    let (s, _guard) = support::session(&m).await;
    let p = connection(s.sandbox.clone());

    // A server that announces a 4 GB frame: refused on its length, before any allocation.
    plant_fake_server(&p, "huge").await;
    let peak = support::rss::Peak::start().await;
    // reset: the real driver leaves, so the next connection reaches the fake server.
    let t = Instant::now();
    let r = p
        .execute(json!({"code": "1", "reset": true}), &ToolContext::default())
        .await;
    let e = r
        .expect_err("a lying server is not an interpreter")
        .to_string();
    assert!(e.contains("over the limit"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
    assert!(peak.growth_mib() < 64, "{} MiB", peak.growth_mib());
    drop(peak);

    // A server that greets like the driver and then floods frames of other cells: the cell's
    // deadline still ends the call, the "interpreter" is killed, memory stays bounded.
    drop(p);
    let gone = s
        .sandbox
        .exec(ExecRequest::new([
            "sh",
            "-c",
            "kill $(cat /tmp/fake.pid) && rm -f /tmp/sandboxd-py/sock",
        ]))
        .await
        .unwrap();
    assert!(gone.success(), "{}", gone.stderr_lossy());
    let p = connection(s.sandbox.clone());
    ok(&run(&p, "y = 1").await);
    plant_fake_server(&p, "flood").await;
    drop(p);
    let p = connection(s.sandbox.clone());
    let peak = support::rss::Peak::start().await;
    let t = Instant::now();
    let r = run_with(&p, json!({"code": "y", "timeout": 3})).await;
    assert!(r.is_error(), "{}", r.render());
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
    assert!(peak.growth_mib() < 64, "{} MiB", peak.growth_mib());
    drop(peak);
    // The fake was killed as a stuck interpreter; the next call gets a real, fresh one.
    let r = run(&p, "2 + 2").await;
    assert_eq!(ok(&r), "4");
}
