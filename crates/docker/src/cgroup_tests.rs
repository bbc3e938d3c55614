//! cgroup.rs on fixture text: the v1 files as this host's kernel (6.18, cgroupfs driver)
//! writes them for a container, the v2 ones as the unified hierarchy does, and the four paths
//! the drivers and versions give.

use super::*;

const ID: &str = "10a4cc40f5b4d757bbada2065bb56511210c7f4da910346e368b1eeecaf4d8e2";

/// A v1 container's memory.stat, cut; its own inactive_file made to differ from the
/// hierarchy's so the test tells which one is taken.
const V1_STAT: &str = "cache 2162688
rss 12378112
shmem 323584
mapped_file 1757184
inactive_anon 12611584
active_anon 90112
inactive_file 1000
active_file 0
hierarchical_memory_limit 9223372036854771712
total_cache 2162688
total_rss 12378112
total_inactive_anon 12611584
total_active_anon 90112
total_inactive_file 1839104
total_active_file 0
total_unevictable 0
";

const V2_STAT: &str = "anon 12378112
file 2162688
kernel 434176
shmem 323584
file_mapped 1757184
active_anon 90112
inactive_anon 12611584
active_file 323584
inactive_file 1839104
unevictable 0
workingset_refault_file 0
";

const V2_CPU_STAT: &str = "usage_usec 3504906
user_usec 2100000
system_usec 1404906
nr_periods 12
nr_throttled 1
throttled_usec 5000
";

#[test]
fn v1_memory_is_the_usage_less_the_hierarchys_inactive_file() {
    assert_eq!(memory_v1("16478208\n", V1_STAT), Some(16478208 - 1839104));
    // A kernel without the total_ lines: the cgroup's own.
    assert_eq!(memory_v1("16478208\n", "inactive_file 8\n"), Some(16478200));
    // No stat lines at all: the usage itself; never below zero.
    assert_eq!(memory_v1("100\n", ""), Some(100));
    assert_eq!(memory_v1("100\n", "total_inactive_file 4096\n"), Some(0));
    assert_eq!(memory_v1("", V1_STAT), None);
    assert_eq!(memory_v1("max\n", V1_STAT), None);
}

#[test]
fn v2_memory_is_the_current_less_inactive_file() {
    assert_eq!(memory_v2("16478208\n", V2_STAT), Some(16478208 - 1839104));
    assert_eq!(memory_v2("16478208\n", ""), Some(16478208));
    assert_eq!(memory_v2("garbage", V2_STAT), None);
}

#[test]
fn cpu_is_microseconds_on_both_versions() {
    assert_eq!(cpu_v1("3504906284\n"), Some(3504906));
    assert_eq!(cpu_v1("-1\n"), None);
    assert_eq!(cpu_v2(V2_CPU_STAT), Some(3504906));
    // A key that only starts with the wanted one is not it.
    assert_eq!(cpu_v2("usage_usec_total 9\n"), None);
    assert_eq!(cpu_v2(""), None);
}

#[test]
fn each_driver_and_version_has_its_path() {
    let root = Path::new("/sys/fs/cgroup");
    let host = |driver, version| Host::from_info(root, driver, version).unwrap();
    assert_eq!(
        host("cgroupfs", "1").dir("memory", ID).unwrap(),
        root.join(format!("memory/docker/{ID}"))
    );
    assert_eq!(
        host("systemd", "1").dir("cpuacct", ID).unwrap(),
        root.join(format!("cpuacct/system.slice/docker-{ID}.scope"))
    );
    assert_eq!(
        host("cgroupfs", "2").dir("memory", ID).unwrap(),
        root.join(format!("docker/{ID}"))
    );
    assert_eq!(
        host("systemd", "2").dir("cpuacct", ID).unwrap(),
        root.join(format!("system.slice/docker-{ID}.scope"))
    );
    // An engine too old to say its version is v1; one without cgroups has no files.
    assert_eq!(host("cgroupfs", ""), host("cgroupfs", "1"));
    assert_eq!(Host::from_info(root, "none", "2"), None);
    assert_eq!(Host::from_info(root, "", "1"), None);
    assert_eq!(Host::from_info(root, "cgroupfs", "3"), None);
}

#[test]
fn only_a_full_id_names_a_path() {
    let host = Host::from_info(Path::new("/sys/fs/cgroup"), "cgroupfs", "2").unwrap();
    let bad = [
        String::new(),
        ID[..12].to_string(),
        "sandboxd-session".to_string(),
        ID.to_uppercase(),
        format!("../{}", &ID[3..]),
        format!("{}/", &ID[1..]),
    ];
    for bad in &bad {
        assert_eq!(host.dir("memory", bad), None, "{bad:?}");
        let e = host.memory(bad).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }
}

/// Writes a container's files under a fake root the way the kernel lays them out.
fn fake(root: &Path, dir: &str, files: &[(&str, &str)]) {
    let dir = root.join(dir);
    std::fs::create_dir_all(&dir).unwrap();
    for (name, text) in files {
        std::fs::write(dir.join(name), text).unwrap();
    }
}

#[test]
fn a_v1_host_reads_memory_and_cpu_from_their_hierarchies() {
    let root = tempfile::tempdir().unwrap();
    let host = Host::from_info(root.path(), "cgroupfs", "1").unwrap();
    // Nothing there yet (a remote engine's container, or a removed one): an error to fall
    // back on, not a zero.
    assert_eq!(host.memory(ID).unwrap_err().kind(), io::ErrorKind::NotFound);
    assert_eq!(
        host.cpu_usec(ID).unwrap_err().kind(),
        io::ErrorKind::NotFound
    );
    let memory = format!("memory/docker/{ID}");
    let stat = [
        ("memory.usage_in_bytes", "16478208\n"),
        ("memory.stat", V1_STAT),
    ];
    fake(root.path(), &memory, &stat);
    let cpu = format!("cpuacct/docker/{ID}");
    fake(root.path(), &cpu, &[("cpuacct.usage", "3504906284\n")]);
    assert_eq!(host.memory(ID).unwrap(), 16478208 - 1839104);
    assert_eq!(host.cpu_usec(ID).unwrap(), 3504906);
}

#[test]
fn a_v2_systemd_host_reads_the_scope_and_refuses_garbage() {
    let root = tempfile::tempdir().unwrap();
    let host = Host::from_info(root.path(), "systemd", "2").unwrap();
    let scope = format!("system.slice/docker-{ID}.scope");
    let files = [
        ("memory.current", "16478208\n"),
        ("memory.stat", V2_STAT),
        ("cpu.stat", V2_CPU_STAT),
    ];
    fake(root.path(), &scope, &files);
    assert_eq!(host.memory(ID).unwrap(), 16478208 - 1839104);
    assert_eq!(host.cpu_usec(ID).unwrap(), 3504906);
    fake(
        root.path(),
        &scope,
        &[("memory.current", "max\n"), ("cpu.stat", "")],
    );
    assert_eq!(
        host.memory(ID).unwrap_err().kind(),
        io::ErrorKind::InvalidData
    );
    assert_eq!(
        host.cpu_usec(ID).unwrap_err().kind(),
        io::ErrorKind::InvalidData
    );
}

#[test]
fn a_host_without_the_engines_hierarchy_is_not_used() {
    let root = tempfile::tempdir().unwrap();
    let v1 = Host::from_info(root.path(), "cgroupfs", "1").unwrap();
    let v2 = Host::from_info(root.path(), "systemd", "2").unwrap();
    assert!(!v1.mounted() && !v2.mounted());
    fake(root.path(), "memory", &[("memory.stat", V1_STAT)]);
    assert!(!v1.mounted(), "cpuacct is missing");
    fake(root.path(), "cpuacct", &[("cpuacct.usage", "1\n")]);
    assert!(v1.mounted() && !v2.mounted());
    fake(
        root.path(),
        "",
        &[("cgroup.controllers", "cpu memory pids\n")],
    );
    assert!(v2.mounted());
}
