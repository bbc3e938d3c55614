//! The python tool against the real engine and image, called through a ToolRegistry with raw
//! JSON as the model sends it: persistent state, values, streams, tracebacks, figures,
//! timeouts, crashes, output floods, protocol garbage, reset and cancellation.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use sandboxd_core::sandbox::manager::Session;
use sandboxd_core::tools::python::Python;
use sandboxd_core::tools::{ToolContext, ToolError, ToolRegistry, ToolResult};
use serde_json::json;

struct Kernel {
    registry: ToolRegistry,
    session: Arc<Session>,
    _guard: support::Cleanup,
}

async fn kernel() -> Kernel {
    let m = support::manager().await;
    let (session, guard) = support::session(&m).await;
    let tool = Python::new(
        session.sandbox.clone(),
        Duration::from_secs(120),
        Duration::from_secs(600),
        256 * 1024,
    );
    let mut registry = ToolRegistry::new();
    registry.register(Arc::new(tool)).expect("register python");
    Kernel {
        registry,
        session,
        _guard: guard,
    }
}

impl Kernel {
    async fn call(&self, args: serde_json::Value) -> ToolResult {
        self.registry
            .execute("python", &args.to_string(), &ToolContext::default())
            .await
            .expect("python call")
    }

    async fn run(&self, code: &str) -> ToolResult {
        self.call(json!({ "code": code })).await
    }
}

fn ok_output(r: &ToolResult) -> &str {
    assert!(!r.is_error(), "unexpected error: {}", r.render());
    &r.output
}

#[tokio::test]
async fn state_values_streams_and_tracebacks() {
    let k = kernel().await;
    let r = k.run("x = 1").await;
    assert_eq!(ok_output(&r), "");
    assert_eq!(ok_output(&k.run("x + 1").await), "2");
    assert_eq!(ok_output(&k.run("'a' * 3").await), "'aaa'");
    // A trailing None is not shown; a statement after an expression hides it.
    assert_eq!(ok_output(&k.run("print('hi')").await), "hi");
    assert_eq!(ok_output(&k.run("y = [1, 2]\ny").await), "[1, 2]");

    let r = k
        .run("import sys\nprint('to-out')\nprint('to-err', file=sys.stderr)")
        .await;
    assert_eq!(ok_output(&r), "to-out\n[stderr]\nto-err");

    let r = k
        .run("import os\nos.system('echo from-shell; echo shell-err >&2')")
        .await;
    let out = ok_output(&r);
    assert!(
        out.starts_with("from-shell\n[stderr]\nshell-err\n"),
        "{out}"
    );
    assert!(
        out.ends_with('0'),
        "the exit status of os.system is the final value: {out}"
    );

    let r = k
        .run("def f(n):\n    raise ValueError(f'boom {n}')\n\nf(41 + 1)")
        .await;
    let err = r
        .error
        .as_deref()
        .expect("an exception is an error observation");
    assert!(err.contains("ValueError: boom 42"), "{err}");
    assert!(err.contains("Traceback (most recent call last)"), "{err}");
    assert!(
        err.contains("<cell-") && err.contains("raise ValueError"),
        "{err}"
    );
    assert!(!err.contains("sandboxd_py"), "driver frames leak: {err}");

    let r = k.run("x = ").await;
    let err = r.error.as_deref().expect("a syntax error");
    assert!(err.contains("SyntaxError"), "{err}");
    assert!(!err.contains("sandboxd_py"), "{err}");

    // State survived the exceptions; the working directory is /workspace.
    assert_eq!(
        ok_output(&k.run("x, __name__, __import__('os').getcwd()").await),
        "(1, '__main__', '/workspace')"
    );
    // input() gets EOF instead of hanging.
    let r = k.run("input('name? ')").await;
    assert!(
        r.error.as_deref().unwrap_or_default().contains("EOFError"),
        "{}",
        r.render()
    );

    // Bad calls the model might send become observations.
    let r = k
        .registry
        .execute("python", r#"{"code": 1}"#, &ToolContext::default())
        .await
        .unwrap();
    assert!(r.is_error());
    let r = k.run("   ").await;
    assert!(r.is_error());
}

#[tokio::test]
async fn a_matplotlib_figure_comes_back_as_a_png() {
    let k = kernel().await;
    let code = "import matplotlib.pyplot as plt\n\
                import numpy as np\n\
                t = np.linspace(0, 6.28, 200)\n\
                plt.plot(t, np.sin(t), linewidth=4)\n\
                plt.title('sine')\n\
                plt.show()";
    let r = k.run(code).await;
    assert!(!r.is_error(), "{}", r.render());
    let b64 = r
        .base64_image
        .as_deref()
        .expect("the figure comes back as an image");
    let png = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .expect("valid base64");
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    assert!(
        r.output.contains("/workspace/figures/figure-1.png"),
        "{}",
        r.output
    );
    assert!(
        !r.output.contains("non-interactive"),
        "plt.show() warns: {}",
        r.output
    );

    // The saved file is the same picture, and it is not blank: check its pixels inside the sandbox.
    let saved = k
        .session
        .sandbox
        .read_file("/workspace/figures/figure-1.png")
        .await
        .unwrap();
    assert_eq!(saved, png);
    let r = k
        .run("import matplotlib.image as mpimg\nimg = mpimg.imread('/workspace/figures/figure-1.png')\nprint(img.shape[2], round(float(img[..., :3].std()), 3) > 0.01, len(np.unique(img.reshape(-1, img.shape[2]), axis=0)) > 10)")
        .await;
    assert_eq!(ok_output(&r), "4 True True");

    // The figure was closed: the next cell has no image; two figures give two files.
    let r = k.run("len(plt.get_fignums())").await;
    assert_eq!(ok_output(&r), "0");
    assert!(r.base64_image.is_none());
    let r = k
        .run("plt.figure(); plt.plot([1, 2]); plt.figure(); plt.bar([1, 2], [3, 4]); None")
        .await;
    assert!(r.base64_image.is_some());
    assert!(
        r.output.contains("figure-2.png") && r.output.contains("figure-3.png"),
        "{}",
        r.output
    );
}

#[tokio::test]
async fn a_timeout_interrupts_the_cell_and_keeps_the_state() {
    let k = kernel().await;
    ok_output(&k.run("kept = 'still here'").await);
    let t = Instant::now();
    let r = k
        .call(json!({"code": "print('before')\nimport time\ntime.sleep(100)", "timeout": 2}))
        .await;
    let took = t.elapsed();
    assert!(took < Duration::from_secs(4), "took {took:?}");
    let err = r
        .error
        .as_deref()
        .expect("a timeout is an error observation");
    assert!(
        err.contains("timed out after 2s") && err.contains("KeyboardInterrupt"),
        "{err}"
    );
    assert!(err.contains("kept"), "{err}");
    assert_eq!(r.output, "before");
    assert_eq!(ok_output(&k.run("kept").await), "'still here'");

    // A shell command the cell started is interrupted too (as Ctrl-C would).
    let t = Instant::now();
    let r = k
        .call(json!({"code": "import os\nos.system('sleep 100')\nafter = 1", "timeout": 2}))
        .await;
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t.elapsed()
    );
    assert!(r.is_error());
    assert_eq!(ok_output(&k.run("kept").await), "'still here'");

    // A cell that ignores SIGINT is killed after the grace period; the state is lost and said so.
    let t = Instant::now();
    let r = k
        .call(json!({"code": "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(100)", "timeout": 1}))
        .await;
    assert!(
        t.elapsed() < Duration::from_secs(8),
        "took {:?}",
        t.elapsed()
    );
    let err = r.error.as_deref().expect("error");
    assert!(
        err.contains("was killed") && err.contains("variables are lost"),
        "{err}"
    );
    let r = k.run("kept").await;
    assert!(
        r.error.as_deref().unwrap_or_default().contains("NameError"),
        "{}",
        r.render()
    );
    assert!(
        r.system
            .as_deref()
            .unwrap_or_default()
            .contains("fresh python interpreter"),
        "{:?}",
        r.system
    );
    let ps = k
        .session
        .sandbox
        .shell(
            "ps -eo args | grep -c '[s]leep 100' || true",
            Default::default(),
        )
        .await
        .unwrap();
    assert_eq!(
        ps.stdout_lossy().trim(),
        "0",
        "the killed interpreter's children are gone"
    );
}

#[tokio::test]
async fn a_dead_interpreter_is_reported_and_replaced() {
    let k = kernel().await;
    ok_output(&k.run("gone = 1").await);
    let r = k.run("import os\nos._exit(1)").await;
    let err = r.error.as_deref().expect("error");
    assert!(
        err.contains("the python interpreter died") && err.contains("exited with code 1"),
        "{err}"
    );
    assert!(err.contains("variables are lost"), "{err}");
    let r = k.run("gone").await;
    assert!(
        r.error.as_deref().unwrap_or_default().contains("NameError"),
        "{}",
        r.render()
    );
    let note = r.system.as_deref().unwrap_or_default();
    assert!(
        note.contains("fresh python interpreter") && note.contains("died"),
        "{note}"
    );
    // The note is given once.
    assert!(k.run("1").await.system.is_none());

    // A forked child that outlives the interpreter does not hide its death.
    ok_output(&k.run("import multiprocessing, time\nchild = multiprocessing.Process(target=time.sleep, args=(1000,))\nchild.start()").await);
    let t = Instant::now();
    let r = k.run("import os\nos._exit(3)").await;
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t.elapsed()
    );
    assert!(
        r.error
            .as_deref()
            .unwrap_or_default()
            .contains("exited with code 3"),
        "{}",
        r.render()
    );

    // A segfault in native code.
    let r = k.run("import ctypes\nctypes.string_at(0)").await;
    let err = r.error.as_deref().expect("error");
    assert!(
        err.contains("died") && err.contains("segmentation fault"),
        "{err}"
    );
    assert_eq!(ok_output(&k.run("2 + 2").await), "4");
}

#[tokio::test]
async fn floods_and_protocol_garbage_do_not_break_the_session() {
    let k = kernel().await;
    let r = k.run("import sys\nfor i in range(5 * 1024):\n    print(str(i).ljust(1023, 'x'))\nprint('the end')").await;
    let out = ok_output(&r);
    assert!(out.len() < 600 * 1024, "{} bytes", out.len());
    assert!(out.contains("bytes cut by sandboxd"));
    assert!(out.starts_with("0xxx"));
    assert!(out.contains("the end"));
    assert!(out.contains("[output was cut in the middle"));

    let r = k.run("x = 5\nprint('SBX1')\nimport os, sys\nos.write(1, b'SBX1\\x00\\x00\\x00\\x05garbage')\nos.write(2, b'SBX1junk')\nsys.__stdout__.write('SBX1')").await;
    assert!(!r.is_error(), "{}", r.render());
    assert!(r.output.starts_with("SBX1\nSBX1"), "{}", r.output);
    assert_eq!(ok_output(&k.run("x * 2").await), "10");
    // A background process that keeps printing after its cell does not leak into later cells.
    ok_output(&k.run("import subprocess\np = subprocess.Popen(['sh', '-c', 'for i in 1 2 3 4 5; do echo bg; sleep 0.2; done'])").await);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(ok_output(&k.run("x").await), "5");

    // A cell that finds the driver's private protocol fds and scribbles on them loses its
    // interpreter, and only that: the host notices, kills it and starts a fresh one.
    let r = k
        .run(
            "import os
for fd in range(3, 64):
    try:
        os.write(fd, b'SBX1\\xff\\xff\\xff\\xffjunk' * 100)
    except OSError:
        pass
import time
time.sleep(1)",
        )
        .await;
    let err = r.error.as_deref().expect("a corrupted channel is an error");
    assert!(err.contains("the python interpreter died"), "{err}");
    let r = k.run("'x' in globals()").await;
    assert_eq!(ok_output(&r), "False");
    assert!(
        r.system
            .as_deref()
            .unwrap_or_default()
            .contains("fresh python interpreter")
    );
}

#[tokio::test]
async fn reset_starts_a_fresh_interpreter() {
    let k = kernel().await;
    ok_output(&k.run("state = 42").await);
    let r = k
        .call(json!({"code": "'state' in globals()", "reset": true}))
        .await;
    assert_eq!(ok_output(&r), "False");
    assert!(
        r.system.as_deref().unwrap_or_default().contains("reset"),
        "{:?}",
        r.system
    );
    ok_output(&k.run("state = 43").await);
    let r = k.call(json!({"code": "", "reset": true})).await;
    assert!(!r.is_error(), "{}", r.render());
    let r = k.run("state").await;
    assert!(r.error.as_deref().unwrap_or_default().contains("NameError"));
}

#[tokio::test]
async fn cancellation_interrupts_the_cell() {
    let k = kernel().await;
    ok_output(&k.run("kept = 7").await);
    let ctx = ToolContext::default();
    let cancel = ctx.cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        cancel.cancel();
    });
    let t = Instant::now();
    let res = k
        .registry
        .execute(
            "python",
            r#"{"code": "import time\ntime.sleep(100)"}"#,
            &ctx,
        )
        .await;
    assert!(matches!(res, Err(ToolError::Cancelled)), "{res:?}");
    assert!(t.elapsed() < Duration::from_secs(3));
    assert_eq!(ok_output(&k.run("kept").await), "7");
}

#[tokio::test]
async fn warm_cell_round_trip() {
    let k = kernel().await;
    ok_output(&k.run("1 + 1").await);
    let mut times = Vec::new();
    for _ in 0..50 {
        let t = Instant::now();
        let r = k.run("1 + 1").await;
        times.push(t.elapsed());
        assert_eq!(r.output, "2");
    }
    times.sort();
    println!(
        "python tool, warm `1 + 1` cell: p50 {:?}, p90 {:?}, max {:?} over {} calls",
        times[times.len() / 2],
        times[times.len() * 9 / 10],
        times[times.len() - 1],
        times.len()
    );
}
