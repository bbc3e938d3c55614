//! Hardening of a session container, checked twice: the settings the engine reports, and
//! what a process inside actually experiences.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::support;

use std::time::Duration;

use sandboxd_core::sandbox::{ExecRequest, ShellOptions};

fn docker_inspect(container: &str, format: &str) -> String {
    let out = std::process::Command::new("docker")
        .args(["inspect", "--format", format, container])
        .output()
        .expect("docker CLI");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[tokio::test]
async fn the_engine_reports_every_hardening_setting() {
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let container = s.handle.clone();
    let hc = |f: &str| docker_inspect(&container, &format!("{{{{json .HostConfig.{f}}}}}"));
    assert_eq!(hc("NetworkMode"), "\"none\"");
    assert_eq!(hc("ReadonlyRootfs"), "true");
    assert_eq!(hc("CapDrop"), "[\"ALL\"]");
    assert_eq!(hc("CapAdd"), "null");
    assert_eq!(hc("Privileged"), "false");
    assert!(hc("SecurityOpt").contains("no-new-privileges:true"));
    assert!(!hc("SecurityOpt").contains("unconfined"));
    assert_eq!(hc("Init"), "true");
    // Under gVisor the host cgroup counts the Sentry's tasks and a stub or so per sandbox
    // process, so the 256 processes are given as 256 × 4 + 128 host tasks (docker.rs).
    let gvisor = support::under_gvisor();
    assert_eq!(hc("PidsLimit"), if gvisor { "1152" } else { "256" });
    assert_eq!(hc("Memory"), (1u64 << 30).to_string());
    assert_eq!(hc("MemorySwap"), (1u64 << 30).to_string());
    assert_eq!(hc("NanoCpus"), "1000000000");
    assert_eq!(hc("OomScoreAdj"), "1000");
    assert_eq!(hc("RestartPolicy.Name"), "\"no\"");
    assert_eq!(hc("Binds"), "null");
    assert_eq!(hc("Mounts"), "null");
    assert!(matches!(hc("Devices").as_str(), "[]" | "null"));
    assert!(hc("MaskedPaths").contains("/proc/kcore"));
    let log = hc("LogConfig");
    assert!(log.contains("max-size"), "{log}");
    let tmpfs = hc("Tmpfs");
    assert!(
        tmpfs.contains("/workspace") && tmpfs.contains("size=1024m") && tmpfs.contains("uid=1000"),
        "{tmpfs}"
    );
    assert!(
        tmpfs.contains("/tmp") && tmpfs.contains("size=256m"),
        "{tmpfs}"
    );
    let ulimits = hc("Ulimits");
    for u in ["nofile", "fsize", "core"] {
        assert!(ulimits.contains(u), "{ulimits}");
    }
    assert_eq!(docker_inspect(&container, "{{.Config.User}}"), "1000:1000");
    let labels = docker_inspect(&container, "{{json .Config.Labels}}");
    assert!(labels.contains("\"sandboxd.managed\":\"true\""), "{labels}");
    assert!(
        labels.contains(&format!("\"sandboxd.session\":\"{}\"", s.id)),
        "{labels}"
    );
    assert!(labels.contains("\"sandboxd.owner\":\"test\""), "{labels}");
}

#[tokio::test]
async fn inside_the_container_nothing_is_granted() {
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let sh = |c: &'static str| {
        let sb = s.sandbox.clone();
        async move { sb.shell(c, ShellOptions::default()).await.unwrap() }
    };
    assert_eq!(sh("id -u").await.stdout_lossy().trim(), "1000");
    let status = sh("cat /proc/self/status").await.stdout_lossy();
    let field = |k: &str| {
        status
            .lines()
            .find(|l| l.starts_with(k))
            .map(|l| l[k.len()..].trim().to_string())
            .unwrap_or_default()
    };
    assert_eq!(field("CapEff:"), "0000000000000000");
    assert_eq!(field("CapPrm:"), "0000000000000000");
    // no_new_privs as the kernel answers prctl(PR_GET_NO_NEW_PRIVS): gVisor's
    // /proc/self/status has no NoNewPrivs line, and this reads the same flag under both.
    let nnp = sh("python3 -c 'import ctypes; print(ctypes.CDLL(None).prctl(39, 0, 0, 0, 0))'")
        .await
        .stdout_lossy();
    assert_eq!(nnp.trim(), "1");
    if support::oci_runtime().as_deref() == Some("runsc") {
        // Under gVisor the system calls meet its user-space kernel (the Sentry), not the
        // host's. Docker's seccomp profile reaches only the container's first process (with
        // runsc --oci-seccomp), not what `docker exec` starts, which is every process of ours
        // (see README: Stronger isolation); so the check here is that gVisor is the kernel.
        let dmesg = sh("dmesg 2>&1 | head -1").await.stdout_lossy();
        assert!(dmesg.contains("gVisor"), "not under gVisor: {dmesg}");
    } else {
        assert_eq!(field("Seccomp:"), "2");
    }
    let ifaces = sh("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
        .await
        .stdout_lossy();
    assert_eq!(ifaces.trim(), "lo");
    // The root is mounted read-only, and writes to it fail (gVisor checks the permission
    // before the mount, so it says "Permission denied" where Linux says "Read-only").
    let root = sh("awk '$2 == \"/\" {print $4}' /proc/mounts")
        .await
        .stdout_lossy();
    assert!(
        root.trim().split(',').any(|o| o == "ro"),
        "the root is not mounted read-only: {root}"
    );
    let w = sh("echo x > /rootfile; echo x > /usr/x; ls /rootfile /usr/x").await;
    let err = w.stderr_lossy();
    assert!(w.stdout_lossy().trim().is_empty(), "{}", w.stdout_lossy());
    assert_eq!(
        err.matches("Read-only file system").count() + err.matches("Permission denied").count(),
        2,
        "{err}"
    );
    let sock =
        sh("find / -name 'docker.sock' -o -name 'containerd.sock' 2>/dev/null | head -5").await;
    assert_eq!(sock.stdout_lossy().trim(), "");
    // A canary on the host never shows up inside.
    let canary = format!("sandboxd-canary-{:016x}", rand::random::<u64>());
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(&canary), "secret").unwrap();
    let found = s
        .sandbox
        .exec(ExecRequest::shell_line(format!("find / \\( -path /proc -o -path /sys \\) -prune -o -name '{canary}' -print 2>/dev/null | head -1; grep -rls {canary} /workspace /tmp /etc /mnt /media /srv /opt /home /root 2>/dev/null | head -1")).timeout(Duration::from_secs(60)))
        .await
        .unwrap();
    assert_eq!(found.stdout_lossy().trim(), "");
    // /workspace is writable and executable by the sandbox user. (find, not stat: under the
    // runsc Debian ships, coreutils' statx with AT_NO_AUTOMOUNT fails; see README.)
    let ws = sh("cd /workspace && printf '#!/bin/sh\\necho ran\\n' > x.sh && chmod +x x.sh && ./x.sh && find /workspace -maxdepth 0 -printf '%U:%G\\n'").await;
    assert_eq!(ws.stdout_lossy(), "ran\n1000:1000\n");
}

#[tokio::test]
async fn the_network_is_unreachable() {
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let probe = r#"
import socket
def tcp(host, port):
    try:
        socket.create_connection((host, port), timeout=3).close()
        return 'open'
    except OSError as e:
        return 'fail'
def dns(name):
    try:
        socket.getaddrinfo(name, 80)
        return 'resolved'
    except OSError:
        return 'fail'
print(tcp('1.1.1.1', 53), tcp('169.254.169.254', 80), dns('example.com'), tcp('8.8.8.8', 443))
"#;
    s.sandbox
        .write_file("/workspace/probe.py", probe.as_bytes())
        .await
        .unwrap();
    let out = s
        .sandbox
        .shell("python3 /workspace/probe.py", ShellOptions::default())
        .await
        .unwrap();
    assert_eq!(
        out.stdout_lossy().trim(),
        "fail fail fail fail",
        "{}",
        out.stderr_lossy()
    );
}
