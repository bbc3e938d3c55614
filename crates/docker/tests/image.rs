//! Integration test of the sandbox image against the real Docker engine.
//!
//! It builds the image if the engine lacks it (a few minutes the first time; later runs reuse it
//! through the recipe-hash tag), then checks what sessions rely on: the no-op rebuild, the image
//! config, and that the tools run as uid 1000 in a container hardened like a session's.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use bollard::Docker;
use bollard::container::LogOutput;
use bollard::exec::{StartExecOptions, StartExecResults};
use bollard::models::{ContainerCreateBody, ExecConfig, HostConfig};
use bollard::query_parameters::{
    CreateContainerOptions, ListContainersOptionsBuilder, RemoveContainerOptionsBuilder,
    StartContainerOptions,
};
use futures::StreamExt;
use sandboxd_docker::image::{
    BuildOutcome, BuildProgress, build_image, ensure_image, image_tag, recipe_hash,
};

const TEST_LABEL: &str = "sandboxd.test";
const TEST_LABEL_VALUE: &str = "image";

fn show_steps(progress: BuildProgress) {
    if let BuildProgress::Step(step) = progress {
        eprintln!("[image] {step}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn sandbox_image_builds_once_and_runs_the_tools_hardened() -> Result<()> {
    let docker = Docker::connect_with_local_defaults()?
        .negotiate_version()
        .await
        .context("the Docker engine is required for this test")?;
    remove_test_containers(&docker).await?;

    let started = Instant::now();
    let tag = ensure_image(&docker, &show_steps).await?;
    eprintln!("[image] ensure_image: {tag} in {:.1?}", started.elapsed());
    assert_eq!(tag, image_tag());

    let started = Instant::now();
    let outcome = build_image(&docker, false, &show_steps).await?;
    eprintln!("[image] rebuild without force: {:.1?}", started.elapsed());
    assert_eq!(outcome, BuildOutcome::UpToDate { tag: tag.clone() });

    let inspect = docker.inspect_image(&tag).await?;
    let config = inspect.config.context("image has no config")?;
    assert_eq!(config.user.as_deref(), Some("1000:1000"));
    assert_eq!(config.working_dir.as_deref(), Some("/workspace"));
    let env = config.env.unwrap_or_default();
    for expected in ["HOME=/workspace", "LANG=C.UTF-8"] {
        assert!(
            env.iter().any(|e| e == expected),
            "{expected} not in {env:?}"
        );
    }
    let labels = config.labels.unwrap_or_default();
    assert_eq!(labels.get("sandboxd.recipe"), Some(&recipe_hash()));
    eprintln!(
        "[image] size: {} MB",
        inspect.size.unwrap_or_default() / 1_000_000
    );

    let id = create_hardened_container(&docker, &tag).await?;
    let checks = check_tools(&docker, &id).await;
    let removed = docker
        .remove_container(
            &id,
            Some(RemoveContainerOptionsBuilder::default().force(true).build()),
        )
        .await;
    checks?;
    removed?;
    Ok(())
}

/// The hardening a session container gets, as far as it matters to what the image must support.
async fn create_hardened_container(docker: &Docker, image: &str) -> Result<String> {
    let tmpfs = HashMap::from([
        (
            "/tmp".to_owned(),
            "rw,nosuid,nodev,size=256m,mode=1777".to_owned(),
        ),
        (
            "/workspace".to_owned(),
            "rw,exec,nosuid,nodev,size=256m,uid=1000,gid=1000".to_owned(),
        ),
    ]);
    let body = ContainerCreateBody {
        image: Some(image.to_owned()),
        user: Some("1000:1000".to_owned()),
        labels: Some(HashMap::from([(
            TEST_LABEL.to_owned(),
            TEST_LABEL_VALUE.to_owned(),
        )])),
        network_disabled: Some(true),
        host_config: Some(HostConfig {
            network_mode: Some("none".to_owned()),
            readonly_rootfs: Some(true),
            cap_drop: Some(vec!["ALL".to_owned()]),
            security_opt: Some(vec!["no-new-privileges:true".to_owned()]),
            tmpfs: Some(tmpfs),
            init: Some(true),
            pids_limit: Some(256),
            memory: Some(1 << 30),
            memory_swap: Some(1 << 30),
            ..Default::default()
        }),
        ..Default::default()
    };
    let id = docker
        .create_container(None::<CreateContainerOptions>, body)
        .await?
        .id;
    Ok(id)
}

async fn check_tools(docker: &Docker, id: &str) -> Result<()> {
    docker
        .start_container(id, None::<StartContainerOptions>)
        .await?;

    let uid = exec_ok(docker, id, &["id", "-u"]).await?;
    assert_eq!(uid.trim(), "1000");
    let home = exec_ok(docker, id, &["sh", "-c", "echo $HOME; pwd"]).await?;
    assert_eq!(home, "/workspace\n/workspace\n");

    // The first pyplot import builds matplotlib's font cache in MPLCONFIGDIR; on a read-only
    // root it must be a writable directory, or matplotlib warns and uses a throwaway one.
    let started = Instant::now();
    let python = exec(
        docker,
        id,
        &[
            "python3",
            "-c",
            "import numpy, pandas, matplotlib\n\
             import matplotlib.pyplot as plt\n\
             plt.plot(pandas.Series(numpy.arange(5)))\n\
             plt.savefig('/workspace/plot.png')\n\
             print(matplotlib.get_cachedir())",
        ],
    )
    .await?;
    eprintln!(
        "[image] first matplotlib import + plot: {:.1?}",
        started.elapsed()
    );
    ensure!(python.code == 0, "python failed: {python:?}");
    assert_eq!(python.stdout.trim(), "/tmp/matplotlib");
    ensure!(
        !python.stderr.contains("temporary"),
        "matplotlib fell back to a temporary config dir: {}",
        python.stderr
    );

    let chromium = exec_ok(docker, id, &["chromium", "--version"]).await?;
    ensure!(chromium.starts_with("Chromium "), "unexpected: {chromium}");
    let socat = exec_ok(docker, id, &["socat", "-V"]).await?;
    ensure!(socat.contains("socat version"), "unexpected: {socat}");
    let tini = exec_ok(docker, id, &["tini", "--version"]).await?;
    ensure!(tini.contains("tini version"), "unexpected: {tini}");

    let helpers = exec_ok(
        docker,
        id,
        &["stat", "-c", "%U %a", "/usr/local/lib/sandboxd"],
    )
    .await?;
    assert_eq!(helpers.trim(), "root 755");
    for helper in helper_files()? {
        let path = format!("/usr/local/lib/sandboxd/{helper}");
        let mode = exec_ok(docker, id, &["stat", "-c", "%U %a", &path]).await?;
        assert_eq!(mode.trim(), "root 755", "{path}");
    }

    let write_root = exec(docker, id, &["touch", "/usr/local/lib/sandboxd/x"]).await?;
    ensure!(write_root.code != 0, "the root filesystem is writable");
    Ok(())
}

/// Paths of the helpers the recipe copies into the image, relative to images/sandbox/helpers.
fn helper_files() -> Result<Vec<String>> {
    let root =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../images/sandbox/helpers");
    let mut found = Vec::new();
    let mut dirs = vec![root.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name.starts_with('.') || name.ends_with('~') || name.ends_with(".swp") {
                continue;
            }
            if path.is_dir() {
                dirs.push(path);
            } else {
                let relative = path.strip_prefix(&root)?.to_string_lossy().into_owned();
                found.push(relative);
            }
        }
    }
    Ok(found)
}

#[derive(Debug)]
struct ExecOutput {
    code: i64,
    stdout: String,
    stderr: String,
}

async fn exec_ok(docker: &Docker, id: &str, cmd: &[&str]) -> Result<String> {
    let output = exec(docker, id, cmd).await?;
    if output.code != 0 {
        bail!("{cmd:?} failed: {output:?}");
    }
    Ok(output.stdout)
}

async fn exec(docker: &Docker, id: &str, cmd: &[&str]) -> Result<ExecOutput> {
    let exec_id = docker
        .create_exec(
            id,
            ExecConfig {
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                cmd: Some(cmd.iter().map(|s| (*s).to_owned()).collect()),
                ..Default::default()
            },
        )
        .await?
        .id;
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    let start = docker
        .start_exec(
            &exec_id,
            Some(StartExecOptions {
                detach: false,
                tty: false,
                output_capacity: None,
            }),
        )
        .await?;
    let StartExecResults::Attached { mut output, .. } = start else {
        bail!("exec started detached");
    };
    let collect = async {
        while let Some(frame) = output.next().await {
            match frame? {
                LogOutput::StdOut { message } | LogOutput::Console { message } => {
                    stdout.extend_from_slice(&message)
                }
                LogOutput::StdErr { message } => stderr.extend_from_slice(&message),
                LogOutput::StdIn { .. } => {}
            }
        }
        anyhow::Ok(())
    };
    tokio::time::timeout(Duration::from_secs(120), collect)
        .await
        .with_context(|| format!("{cmd:?} timed out"))??;

    // The output stream can end just before the daemon records the exit code.
    let code = loop {
        let inspect = docker.inspect_exec(&exec_id).await?;
        if inspect.running != Some(true) {
            break inspect.exit_code.context("exec has no exit code")?;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    Ok(ExecOutput {
        code,
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    })
}

/// Leftovers from an earlier run that was killed before it could clean up.
async fn remove_test_containers(docker: &Docker) -> Result<()> {
    let filters = HashMap::from([("label", vec![format!("{TEST_LABEL}={TEST_LABEL_VALUE}")])]);
    let stale = docker
        .list_containers(Some(
            ListContainersOptionsBuilder::default()
                .all(true)
                .filters(&filters)
                .build(),
        ))
        .await?;
    for container in stale {
        if let Some(id) = container.id {
            docker
                .remove_container(
                    &id,
                    Some(RemoveContainerOptionsBuilder::default().force(true).build()),
                )
                .await?;
        }
    }
    Ok(())
}
