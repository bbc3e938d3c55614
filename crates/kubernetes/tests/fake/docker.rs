//! The fake's kubelet: a pod as a Docker container started with the docker CLI, with only
//! the hardening its spec asks for (so the spec is what is tested), plus the admission
//! checks of the restricted Pod Security profile. The node's own settings, which a pod
//! spec cannot carry, are the fake's: `--pids-limit` (a kubelet's `podPidsLimit`) and
//! `--init` (the pause container that reaps, with `shareProcessNamespace`), and the
//! network: `none` where the fake's plugin enforces NetworkPolicy, a bridge where not.

use k8s_openapi::api::core::v1::{Container, Pod};

/// The kubelet's `podPidsLimit` on the fake's node.
const NODE_PIDS_LIMIT: u32 = 1024;

/// What the restricted profile refuses (kubernetes.io, Pod Security Standards).
pub(crate) fn restricted(pod: &Pod) -> Result<(), String> {
    let spec = pod.spec.as_ref().ok_or("no spec")?;
    if spec.host_network == Some(true) || spec.host_pid == Some(true) || spec.host_ipc == Some(true)
    {
        return Err("host namespaces".into());
    }
    if spec.volumes.iter().flatten().any(|v| v.empty_dir.is_none()) {
        return Err("a volume other than emptyDir".into());
    }
    let pod_sc = spec.security_context.clone().unwrap_or_default();
    for c in &spec.containers {
        let sc = c.security_context.clone().unwrap_or_default();
        if sc.run_as_non_root.or(pod_sc.run_as_non_root) != Some(true) {
            return Err(format!("container {} must set runAsNonRoot=true", c.name));
        }
        if sc.allow_privilege_escalation != Some(false) {
            return Err("allowPrivilegeEscalation != false".into());
        }
        let drops = sc.capabilities.and_then(|c| c.drop).unwrap_or_default();
        if !drops.iter().any(|d| d == "ALL") {
            return Err("unrestricted capabilities".into());
        }
        let seccomp = sc.seccomp_profile.or(pod_sc.seccomp_profile.clone());
        if !seccomp.is_some_and(|s| s.type_ == "RuntimeDefault" || s.type_ == "Localhost") {
            return Err("seccompProfile".into());
        }
        if sc.privileged == Some(true) {
            return Err("privileged".into());
        }
    }
    Ok(())
}

/// "256Mi" → 256; "500m" → 0.5 CPUs; anything else is refused.
fn mebibytes(q: &str) -> Result<u64, String> {
    q.strip_suffix("Mi")
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("quantity {q:?} is not in Mi"))
}

fn millicpus(q: &str) -> Result<f64, String> {
    q.strip_suffix('m')
        .and_then(|n| n.parse::<f64>().ok())
        .map(|m| m / 1000.0)
        .ok_or_else(|| format!("cpu {q:?} is not in m"))
}

fn limit(c: &Container, what: &str) -> Result<String, String> {
    let r = c.resources.clone().unwrap_or_default();
    let l = r.limits.unwrap_or_default();
    let q = r.requests.unwrap_or_default();
    let (Some(limit), Some(request)) = (l.get(what), q.get(what)) else {
        return Err(format!("no {what} limit and request"));
    };
    if limit != request {
        return Err(format!("{what}: the limit is not the request"));
    }
    Ok(limit.0.clone())
}

/// The `docker run` arguments of a pod.
fn run_args(pod: &Pod, tag: &str, network: &str) -> Result<Vec<String>, String> {
    let spec = pod.spec.as_ref().ok_or("no spec")?;
    if spec.runtime_class_name.is_some() {
        return Err("the fake's node has no RuntimeClass".into());
    }
    let [c] = spec.containers.as_slice() else {
        return Err("one container per pod".into());
    };
    let sc = c.security_context.clone().unwrap_or_default();
    let uid = sc.run_as_user.ok_or("no runAsUser")?;
    let gid = sc.run_as_group.ok_or("no runAsGroup")?;
    let name = pod.metadata.name.clone().unwrap_or_default();
    let mut a: Vec<String> = ["run", "-d", "--network", network, "--init"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    a.extend([
        format!("--name=fakek8s-{tag}-{name}"),
        format!("--label=sandboxd-fake-k8s={tag}"),
    ]);
    a.push(format!("--user={uid}:{gid}"));
    a.push(format!("--pids-limit={NODE_PIDS_LIMIT}"));
    if sc.read_only_root_filesystem == Some(true) {
        a.push("--read-only".into());
    }
    if sc
        .capabilities
        .and_then(|c| c.drop)
        .unwrap_or_default()
        .iter()
        .any(|d| d == "ALL")
    {
        a.push("--cap-drop=ALL".into());
    }
    if sc.allow_privilege_escalation == Some(false) {
        a.push("--security-opt=no-new-privileges:true".into());
    }
    let memory = mebibytes(&limit(c, "memory")?)?;
    a.push(format!("--memory={memory}m"));
    a.push(format!("--memory-swap={memory}m"));
    a.push(format!("--cpus={}", millicpus(&limit(c, "cpu")?)?));
    let fs_group = spec.security_context.as_ref().and_then(|s| s.fs_group);
    for m in c.volume_mounts.iter().flatten() {
        let v = spec
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == m.name)
            .ok_or("a mount without its volume")?;
        let dir = v.empty_dir.as_ref().ok_or("not an emptyDir")?;
        let size = mebibytes(
            &dir.size_limit
                .as_ref()
                .ok_or("an emptyDir without sizeLimit")?
                .0,
        )?;
        // An emptyDir is a directory owned by the fsGroup, writable by the pod's user.
        let owner = match fs_group {
            Some(g) => format!(",uid={uid},gid={g},mode=0775"),
            None => ",mode=1777".to_string(),
        };
        a.push(format!(
            "--tmpfs={}:rw,exec,nosuid,nodev,size={size}m{owner}",
            m.mount_path
        ));
    }
    if let Some(dir) = &c.working_dir {
        a.push(format!("--workdir={dir}"));
    }
    for e in c.env.iter().flatten() {
        a.push(format!(
            "--env={}={}",
            e.name,
            e.value.clone().unwrap_or_default()
        ));
    }
    let command = c.command.clone().unwrap_or_default();
    let (entry, rest) = command.split_first().ok_or("no command")?;
    a.push(format!("--entrypoint={entry}"));
    a.push(c.image.clone().ok_or("no image")?);
    a.extend(rest.iter().cloned());
    a.extend(c.args.iter().flatten().cloned());
    Ok(a)
}

/// Starts the pod's container; its id.
pub(crate) async fn run(pod: &Pod, tag: &str, network: &str) -> Result<String, String> {
    let args = run_args(pod, tag, network)?;
    let out = tokio::process::Command::new("docker")
        .args(&args)
        .output()
        .await
        .map_err(|e| format!("docker: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "docker run: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// `docker rm -f`; whether it removed something.
pub(crate) fn remove(container: &str) -> bool {
    std::process::Command::new("docker")
        .args(["rm", "-f", container])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Removes every container of one fake.
pub(crate) fn remove_tagged(tag: &str) {
    let Ok(out) = std::process::Command::new("docker")
        .args([
            "ps",
            "-aq",
            "--filter",
            &format!("label=sandboxd-fake-k8s={tag}"),
        ])
        .output()
    else {
        return;
    };
    for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
        remove(id);
    }
}
