//! A sandbox must never hurt the host (issue 15): code with a shell in the container attacks
//! the host through every channel it has, and the host stays alive, bounded and truthful.
//! Real engine, real image; host memory is this test process's peak RSS from /proc.
//!
//! Every test here measures host memory, so they run one at a time (`rss::Peak` serializes).
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::browser_support;
use crate::support;

use std::time::Duration;

use chromiumoxide::Browser;
use chromiumoxide::handler::HandlerConfig;
use futures::StreamExt;
use sandboxd_core::sandbox::copy_out;
use sandboxd_core::sandbox::tunnel::Tunnel;
use sandboxd_core::sandbox::ws_guard::DEVTOOLS_LIMITS;
use sandboxd_core::sandbox::{ExecRequest, Sandbox, ShellOptions};
use sandboxd_core::tools::browser::BrowserUse;
use serde_json::json;
use support::rss::Peak;

const FAKE_DEVTOOLS: &str = include_str!("hostile/fake_devtools.py");

/// The host may spend this much on any one attack (the bound is 200 MB).
const HOST_BUDGET_MIB: u64 = 150;

async fn sh(sb: &dyn Sandbox, line: &str) -> String {
    let out = sb
        .shell(
            line,
            ShellOptions {
                timeout: Duration::from_secs(120),
                ..ShellOptions::default()
            },
        )
        .await
        .expect("shell");
    assert_eq!(
        out.exit_code,
        Some(0),
        "{line}: {}{}",
        out.stdout_lossy(),
        out.stderr_lossy()
    );
    out.stdout_lossy()
}

/// Starts the fake DevTools server in `mode` on `port` inside the sandbox and waits for its ready
/// file, never by connecting: a probe connection would be a hit, and the server's thread could
/// record it after any clean-up when the machine is busy.
async fn plant_fake_devtools(sb: &dyn Sandbox, mode: &str, port: u16) {
    sb.write_file("/tmp/fake_devtools.py", FAKE_DEVTOOLS.as_bytes())
        .await
        .unwrap();
    sh(
        sb,
        &format!(
            "(python3 /tmp/fake_devtools.py {mode} {port} > /tmp/fake-{port}.log 2>&1 &); \
             for i in $(seq 100); do [ -e /tmp/fake-ready-{port} ] && break; sleep 0.1; done"
        ),
    )
    .await;
}

#[tokio::test]
async fn a_planted_devtools_endpoint_is_never_used() {
    let peak = Peak::start().await;
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let sb = s.sandbox.as_ref();
    plant_fake_devtools(sb, "huge", 9333).await;
    // The attack of the issue: keep a DevToolsActivePort naming the fake server in every
    // profile directory the host could use, rewritten as fast as the host removes it.
    sh(
        sb,
        "(while true; do for n in 0 1 2 3; do mkdir -p /tmp/chromium-$n 2>/dev/null; \
         printf '9333\\n/devtools/browser/fake\\n' > /tmp/chromium-$n/DevToolsActivePort 2>/dev/null; \
         done; sleep 0.02; done > /dev/null 2>&1 &)",
    )
    .await;

    let tool = BrowserUse::new(s.sandbox.clone());
    sb.write_file(
        "/workspace/p.html",
        b"<title>Real page</title><h1>real</h1>",
    )
    .await
    .unwrap();
    let r = browser_support::ok(
        &tool,
        json!({"action": "go_to_url", "url": "file:///workspace/p.html"}),
    )
    .await;
    assert!(r.output.contains("Real page"), "{}", r.render());
    let hit = sb.stat("/tmp/fake-hit-9333").await;
    assert!(hit.is_err(), "the host connected to the planted server");
    tool.shutdown().await;
    let growth = peak.growth_mib();
    println!("peak host RSS growth, planted DevTools endpoint: {growth} MiB");
    assert!(growth < HOST_BUDGET_MIB, "{growth} MiB");
}

/// chromiumoxide (which disables tungstenite's limits) against a hostile server through the
/// guarded tunnel: the connection is cut, the host's memory stays flat.
async fn attack_through_the_tunnel(mode: &str, port: u16, expect: &str) {
    let peak = Peak::start().await;
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    plant_fake_devtools(s.sandbox.as_ref(), mode, port).await;
    let tunnel = Tunnel::open_websocket(s.sandbox.clone(), port, "test-ws", DEVTOOLS_LIMITS)
        .await
        .unwrap();
    let url = format!("ws://{}/devtools/browser/fake", tunnel.addr());
    let connected = tokio::time::timeout(
        Duration::from_secs(30),
        Browser::connect_with_config(url, HandlerConfig::default()),
    )
    .await
    .expect("connect did not finish");
    if let Ok((browser, mut handler)) = connected {
        let driver = tokio::spawn(async move { while handler.next().await.is_some() {} });
        let closed = tunnel.closed_token();
        tokio::select! {
            r = browser.version() => assert!(r.is_err(), "the fake server answered"),
            _ = closed.cancelled() => {}
            _ = tokio::time::sleep(Duration::from_secs(60)) => panic!("neither an error nor a cut"),
        }
        driver.abort();
    }
    tokio::time::timeout(Duration::from_secs(30), tunnel.closed_token().cancelled())
        .await
        .expect("the tunnel stayed open");
    let why = tunnel
        .refusal()
        .expect("the guard did not cut the connection");
    assert!(why.contains(expect), "{why}");
    let growth = peak.growth_mib();
    println!("peak host RSS growth, websocket attack {mode}: {growth} MiB ({why})");
    assert!(growth < HOST_BUDGET_MIB, "{mode}: {growth} MiB");
}

#[tokio::test]
async fn a_frame_claiming_2_pow_45_bytes_is_cut_before_the_host_allocates() {
    attack_through_the_tunnel("huge", 9334, "a frame of 35184372088832 bytes").await;
}

#[tokio::test]
async fn an_endless_message_is_cut_at_the_message_cap() {
    attack_through_the_tunnel("endless", 9335, "a message of more than").await;
}

#[tokio::test]
async fn an_endless_upgrade_head_is_cut() {
    attack_through_the_tunnel("head", 9336, "HTTP upgrade head longer than").await;
}

#[tokio::test]
async fn a_planted_usercustomize_does_not_reach_the_helpers_and_timeouts_really_kill() {
    let _peak = Peak::start().await;
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let sb = s.sandbox.as_ref();
    // Before any helper starts: a hook that would make every kill a no-op and mark each
    // python process it ran in.
    sh(
        sb,
        "d=$(python3 -c 'import site; print(site.getusersitepackages())') && mkdir -p \"$d\" && \
         printf 'import os\\nopen(\"/workspace/hijacked\", \"a\").write(\"usercustomize\\\\n\")\\nos.kill = lambda *a: None\\n' > \"$d/usercustomize.py\" && \
         echo 'import os; open(\"/workspace/hijacked\", \"a\").write(\"pth\\n\")' > \"$d/zz_hook.pth\" && \
         python3 -c 'import os; os.kill(os.getpid(), 0)' && test -s /workspace/hijacked && rm /workspace/hijacked",
    )
    .await;

    // The persistent shell: a command that outlives its timeout.
    let out = sb
        .shell(
            "sleep 1000",
            ShellOptions {
                timeout: Duration::from_secs(3),
                ..ShellOptions::default()
            },
        )
        .await
        .expect("a confirmed kill is not an error");
    assert!(out.timed_out);
    // A one-shot exec that outlives its timeout.
    let out = sb
        .exec(ExecRequest::new(["sleep", "1001"]).timeout(Duration::from_secs(2)))
        .await
        .expect("a confirmed kill is not an error");
    assert!(out.timed_out);
    // The file helper still speaks its protocol.
    sb.write_file("/workspace/ok.txt", b"fine").await.unwrap();
    assert_eq!(sb.read_file("/workspace/ok.txt").await.unwrap(), b"fine");

    // Really gone, checked without python (which would run the hook).
    let alive = sh(
        sb,
        "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c '^sleep 100[01]' || true",
    )
    .await;
    assert_eq!(alive.trim(), "0", "a timed-out command is still running");
    assert!(
        sb.stat("/workspace/hijacked").await.is_err(),
        "a helper ran the planted hook: {:?}",
        sb.read_file("/workspace/hijacked").await
    );
}

/// Copies /workspace out the way `sandboxd run` does, into a fresh directory under `root`.
async fn copy_workspace(sb: &dyn Sandbox, root: &std::path::Path) -> copy_out::CopyReport {
    let dest = root.join("out");
    std::fs::create_dir(&dest).unwrap();
    copy_out::copy_dir_out(
        sb,
        "/workspace",
        &dest,
        1024 << 20,
        Duration::from_secs(300),
    )
    .await
    .expect("copy-out")
}

#[tokio::test]
async fn a_sparse_file_of_1000_mb_costs_the_host_nothing() {
    let peak = Peak::start().await;
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let sb = s.sandbox.as_ref();
    sh(
        sb,
        "truncate -s 1000M /workspace/holes.bin && echo 'the deliverable' > /workspace/report.md",
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let report = copy_workspace(sb, dir.path()).await;
    let growth = peak.growth_mib();
    println!("peak host RSS growth, copy-out of a 1000 MB sparse file: {growth} MiB");
    assert!(growth < HOST_BUDGET_MIB, "{growth} MiB");
    let out = dir.path().join("out");
    assert_eq!(
        std::fs::read_to_string(out.join("report.md")).unwrap(),
        "the deliverable\n"
    );
    if support::under_gvisor() {
        // gVisor's tmpfs has no holes: the file reports all its blocks as allocated and
        // SEEK_DATA fails, so tar sends it as 1000 MB of data, which costs what real data
        // of that size costs (the workspace quota bounds it) and streams through the host.
        return;
    }
    assert!(
        !out.join("holes.bin").exists(),
        "the sparse file was expanded"
    );
    let skipped = &report.summary.skipped;
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    assert_eq!(skipped[0].path, "./holes.bin");
    assert!(
        skipped[0]
            .reason
            .contains("sparse file of 1048576000 bytes"),
        "{skipped:?}"
    );
    assert!(report.is_partial());
}

#[tokio::test]
async fn a_flood_into_the_tar_stderr_is_capped() {
    let peak = Peak::start().await;
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let sb = s.sandbox.as_ref();
    // A watcher that stops the tar as soon as it appears, writes 1 GB into its stderr through
    // /proc, and lets it go on.
    sh(
        sb,
        "head -c 32M /dev/urandom > /workspace/data.bin && \
         (while true; do for p in /proc/[0-9]*; do \
            if [ \"$(cat $p/comm 2>/dev/null)\" = tar ]; then kill -STOP ${p#/proc/}; \
              head -c 1000M /dev/zero > $p/fd/2 && echo flooded > /tmp/flooded; kill -CONT ${p#/proc/}; exit 0; fi; \
          done; done > /dev/null 2>&1 &)",
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let report = copy_workspace(sb, dir.path()).await;
    let growth = peak.growth_mib();
    println!("peak host RSS growth, 1 GB flood into tar's stderr: {growth} MiB");
    assert!(
        sb.stat("/tmp/flooded").await.is_ok(),
        "the flood did not happen"
    );
    assert!(growth < HOST_BUDGET_MIB, "{growth} MiB");
    // Head and tail of the flood, with the cut marked.
    assert!(
        report.warnings.len() <= copy_out::STDERR_CAP + 64,
        "{}",
        report.warnings.len()
    );
    assert!(report.warnings.contains("bytes cut by sandboxd"));
    let copied = std::fs::metadata(dir.path().join("out/data.bin")).unwrap();
    assert_eq!(copied.len(), 32 << 20);
}

#[tokio::test]
async fn one_venv_hard_link_or_fifo_no_longer_costs_every_deliverable() {
    let _peak = Peak::start().await;
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let sb = s.sandbox.as_ref();
    sh(
        sb,
        "cd /workspace && mkdir -p .venv/bin results && ln -s /usr/bin/python3 .venv/bin/python3 && \
         ln -s python3 .venv/bin/python && echo '# Report' > report.md && echo 'a,b' > results/table.csv && \
         echo original > results/a.txt && ln results/a.txt results/b.txt && mkfifo pipe && \
         ln -s ../../../etc/passwd results/escape && echo s > locked.txt && chmod 000 locked.txt && \
         chmod u+s report.md 2>/dev/null; true",
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let report = copy_workspace(sb, dir.path()).await;
    let out = dir.path().join("out");
    assert_eq!(
        std::fs::read_to_string(out.join("report.md")).unwrap(),
        "# Report\n"
    );
    assert_eq!(
        std::fs::read_to_string(out.join("results/table.csv")).unwrap(),
        "a,b\n"
    );
    // The relative in-tree link is kept; the absolute one is not.
    assert_eq!(
        std::fs::read_link(out.join(".venv/bin/python")).unwrap(),
        std::path::Path::new("python3")
    );
    assert!(std::fs::symlink_metadata(out.join(".venv/bin/python3")).is_err());
    // Of two hard-linked names, the first is a file and the second a (refused) link.
    let names: Vec<bool> = ["a.txt", "b.txt"]
        .iter()
        .map(|n| out.join("results").join(n).exists())
        .collect();
    assert_eq!(names.iter().filter(|x| **x).count(), 1, "{names:?}");
    assert!(std::fs::symlink_metadata(out.join("pipe")).is_err());
    assert!(std::fs::symlink_metadata(out.join("results/escape")).is_err());

    let reasons: Vec<String> = report
        .summary
        .skipped
        .iter()
        .map(|s| format!("{}: {}", s.path, s.reason))
        .collect();
    let has = |path: &str, why: &str| {
        reasons
            .iter()
            .any(|r| r.starts_with(path) && r.contains(why))
    };
    assert!(has("./.venv/bin/python3", "is absolute"), "{reasons:#?}");
    assert!(
        has("./results/", "hard links are not allowed"),
        "{reasons:#?}"
    );
    assert!(has("./pipe", "FIFOs are not allowed"), "{reasons:#?}");
    assert!(has("./results/escape", "escapes the root"), "{reasons:#?}");
    assert_eq!(reasons.len(), 4, "{reasons:#?}");
    // A file tar cannot read costs only itself, and is reported.
    assert!(report.tar_incomplete, "{}", report.warnings);
    assert!(
        report.warnings.contains("locked.txt"),
        "{}",
        report.warnings
    );
    assert!(!out.join("locked.txt").exists());
    assert!(report.is_partial());
    // Nothing outside the output directory.
    let beside: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(beside.len(), 1);
}

#[tokio::test]
async fn read_file_of_a_99_mb_fake_png_is_refused_without_reading_it() {
    let peak = Peak::start().await;
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let sb = s.sandbox.clone();
    sh(
        sb.as_ref(),
        "printf '\\x89PNG\\r\\n\\x1a\\n' > /workspace/fake.png && head -c 99M /dev/zero >> /workspace/fake.png && \
         printf '\\x89PNG\\r\\n\\x1a\\n' > /workspace/small.png && head -c 1000 /dev/zero >> /workspace/small.png",
    )
    .await;
    let tool = std::sync::Arc::new(sandboxd_core::tools::files::ReadFile::new(sb.clone(), 0));
    let ctx = sandboxd_core::tools::ToolContext::default();
    use sandboxd_core::tools::Tool;
    // Three at once, as three MCP clients would.
    let calls = (0..3).map(|_| {
        let tool = tool.clone();
        let ctx = ctx.clone();
        async move {
            tool.execute(json!({"path": "fake.png"}), &ctx)
                .await
                .unwrap()
        }
    });
    for r in futures::future::join_all(calls).await {
        let e = r.error.expect("a 99 MB image was returned");
        assert!(e.contains("over the 4194304-byte cap for images"), "{e}");
        assert!(r.base64_image.is_none());
    }
    let small = tool
        .execute(json!({"path": "small.png"}), &ctx)
        .await
        .unwrap();
    assert!(small.base64_image.is_some(), "{}", small.render());
    let growth = peak.growth_mib();
    println!("peak host RSS growth, 3 parallel read_file of a 99 MB PNG: {growth} MiB");
    assert!(growth < 64, "{growth} MiB");
}

#[tokio::test]
async fn flooding_every_channel_keeps_the_host_bounded() {
    let peak = Peak::start().await;
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let config = sandboxd_core::config::Config::load_with_env(None, &[]).unwrap();
    let registry =
        sandboxd_core::tools::session::server_tools(s.sandbox.clone(), &s.limits, &config);
    let ctx = sandboxd_core::tools::ToolContext::default();
    let mut figures = Vec::new();
    for (name, args) in [
        // 100 MB on each stream, without a single newline.
        (
            "bash",
            json!({"command": "head -c 100M /dev/zero | tr '\\0' a; head -c 100M /dev/zero | tr '\\0' b >&2", "timeout": 300}),
        ),
        // A 200 MB repr.
        ("python", json!({"code": "'x' * 200_000_000"})),
        // 200 figures in one cell.
        (
            "python",
            json!({"code": "import matplotlib.pyplot as plt\nfor i in range(200):\n    plt.figure(); plt.plot([0, i])\n"}),
        ),
    ] {
        let r = registry
            .execute(name, &args.to_string(), &ctx)
            .await
            .expect("the tool ran");
        let size = r.output.len() + r.base64_image.as_ref().map_or(0, String::len);
        assert!(size < 8 << 20, "{name}: a result of {size} bytes");
        figures.push(r.render().chars().take(300).collect::<String>());
    }
    // A screenshot of a 20000-pixel page is of the viewport only.
    s.sandbox
        .write_file(
            "/workspace/tall.html",
            b"<title>Tall</title><div style='height:20000px;background:linear-gradient(red,blue)'>top</div>",
        )
        .await
        .unwrap();
    let r = registry
        .execute(
            "browser_use",
            &json!({"action": "go_to_url", "url": "file:///workspace/tall.html"}).to_string(),
            &ctx,
        )
        .await
        .expect("browser_use ran");
    assert!(r.output.contains("Tall"), "{}", r.render());
    let shot = r.base64_image.expect("a screenshot");
    assert!(
        shot.len() < sandboxd_core::tools::MAX_IMAGE_BYTES,
        "{}",
        shot.len()
    );
    let growth = peak.growth_mib();
    println!(
        "peak host RSS growth, every channel flooded: {growth} MiB (peak {} MiB); {figures:?}",
        peak.peak_mib()
    );
    assert!(growth < HOST_BUDGET_MIB, "{growth} MiB");
}

#[tokio::test]
async fn a_listing_bigger_than_the_helper_frame_is_cut_not_broken() {
    let _peak = Peak::start().await;
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let sb = s.sandbox.as_ref();
    // 8000 names of 200 characters: about 1.8 MB of listing, over the 1 MiB frame header.
    sh(
        sb,
        "mkdir /workspace/many && cd /workspace/many && \
         python3 -c \"import os; [open('%05d' % i + 'n' * 195, 'w').close() for i in range(8000)]\"",
    )
    .await;
    let entries = sb
        .list_dir("/workspace/many")
        .await
        .expect("a capped listing");
    assert!(
        entries.len() > 1000 && entries.len() < 8000,
        "{}",
        entries.len()
    );
    assert!(
        entries[0].name.starts_with("00000"),
        "sorted and from the start"
    );
    // The file helper still works afterwards.
    sb.write_file("/workspace/after.txt", b"ok").await.unwrap();
    assert_eq!(sb.read_file("/workspace/after.txt").await.unwrap(), b"ok");
    let tool = sandboxd_core::tools::files::ListDir::new(s.sandbox.clone());
    use sandboxd_core::tools::Tool;
    let r = tool
        .execute(
            json!({"path": "/workspace/many"}),
            &sandboxd_core::tools::ToolContext::default(),
        )
        .await
        .unwrap();
    assert!(r.error.is_none(), "{}", r.render());
    assert!(
        r.render().contains("only the first 1000 are shown"),
        "{}",
        r.render()
    );
}

/// A genuine Chromium made to send one huge CDP message (a page logs a 40 MB string, which
/// Runtime.consoleAPICalled carries whole): the guard cuts it, the tool says so and recovers.
/// (Much more than 40 MB makes the container itself run out of memory first.)
#[tokio::test]
async fn a_page_that_makes_chromium_send_a_huge_message_is_cut_and_reported() {
    let peak = Peak::start().await;
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let sb = s.sandbox.as_ref();
    sb.write_file(
        "/workspace/big.html",
        b"<title>Big</title><h1>big</h1><script>setTimeout(() => console.log('x'.repeat(40 * 1024 * 1024)), 300)</script>",
    )
    .await
    .unwrap();
    sb.write_file(
        "/workspace/small.html",
        b"<title>Small</title><h1>small</h1>",
    )
    .await
    .unwrap();
    let tool = BrowserUse::new(s.sandbox.clone());
    browser_support::call(
        &tool,
        json!({"action": "go_to_url", "url": "file:///workspace/big.html"}),
    )
    .await;
    // The log line comes a moment later; the cut shows up in the notes of some later action.
    // Building and sending 40 MB takes Chromium seconds on a loaded host (10 waits once all
    // came back empty beside another test run), so this waits up to 30 of them; the first
    // note ends the loop.
    let mut notes = String::new();
    for _ in 0..30 {
        let waited = browser_support::call(&tool, json!({"action": "wait", "seconds": 1})).await;
        notes.push_str(&format!("{:?} {:?}\n", waited.error, waited.system));
        if notes.contains("sandboxd cut the connection") {
            break;
        }
    }
    assert!(
        notes.contains("sandboxd cut the connection to Chromium")
            && (notes.contains("(the cap is 33554432)")
                || notes.contains("a message of more than 33554432 bytes")),
        "{notes}"
    );
    // The next action gets a fresh browser.
    let r = browser_support::ok(
        &tool,
        json!({"action": "go_to_url", "url": "file:///workspace/small.html"}),
    )
    .await;
    assert!(r.output.contains("Small"), "{}", r.render());
    tool.shutdown().await;
    let growth = peak.growth_mib();
    println!("peak host RSS growth, a page logging a 40 MB string: {growth} MiB");
    assert!(growth < HOST_BUDGET_MIB, "{growth} MiB");
}
