//! The GPU memory-limit hook as a container runtime runs it (docs/design.md §7, "Memory limits
//! the kernel enforces"): the built `das-kubelet-plugin cdi-hook memory-limit …` with the OCI
//! state of a live process on standard input and the emulated setter, which writes the
//! process's real leaf cgroup's `dmem.max` into a fake tree; and the refusals (a dead pid,
//! missing arguments) a runtime turns into a failed container create.
//!
//! The process must sit in a cgroup v2 cgroup of its own (the hook refuses the root, as a
//! container never sits there). Where the test's own processes sit in the root (a host with the
//! hybrid layout, or a container with its own cgroup namespace), the test makes a cgroup on a
//! cgroup2 mount of its own (root only) and moves the process there; without the privilege it
//! says so and checks the refusals only.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

const UUID: &str = "GPU-2cee9e47-0099-ae43-ff45-2a6b59d21e4a";

/// Runs the hook with `args` after `cdi-hook memory-limit`, `state` on standard input.
fn hook(args: &[&str], state: &str) -> (i32, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_das-kubelet-plugin"))
        .args(["cdi-hook", "memory-limit"])
        .args(args)
        // None of the plugin's environment is needed.
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("runs");
    // A hook that refuses its arguments exits before it reads: a broken pipe is fine.
    let _ = child.stdin.take().unwrap().write_all(state.as_bytes());
    let out = child.wait_with_output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    (out.status.code().unwrap_or(-1), text)
}

fn state(pid: u32) -> String {
    format!(r#"{{"ociVersion":"1.2.0","id":"x","status":"creating","pid":{pid},"bundle":"/tmp"}}"#)
}

/// The cgroup v2 path of process `pid` (its `0::` line).
fn cgroup_v2_path(pid: u32) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .expect("a cgroup v2 line")
        .to_string()
}

/// A process in a cgroup v2 cgroup other than the root, and what to undo when it ends.
struct Container {
    child: Child,
    /// The cgroup made for it, and the cgroup2 mount made for that, if any.
    made: Option<(PathBuf, Option<tempfile::TempDir>)>,
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some((cgroup, mount)) = self.made.take() {
            let _ = std::fs::remove_dir(&cgroup);
            if let Some(dir) = mount {
                let _ = Command::new("umount").arg(dir.path()).status();
            }
        }
    }
}

/// The cgroup2 mount point, if the host has one mounted.
fn cgroup2_mount() -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|l| {
        let (before, after) = l.split_once(" - ")?;
        let mount_point = before.split_whitespace().nth(4)?;
        (after.split_whitespace().next() == Some("cgroup2")).then(|| PathBuf::from(mount_point))
    })
}

/// `sleep 30` in a cgroup of its own: as spawned where that is not the root, else moved into
/// a new cgroup on the host's cgroup2 mount or on one made here. `None`: not possible here (no
/// privilege to make a cgroup).
fn container() -> Option<Container> {
    let child = Command::new("sleep").arg("30").spawn().expect("sleep");
    let mut c = Container { child, made: None };
    if cgroup_v2_path(c.child.id()) != "/" {
        return Some(c);
    }
    let (root, mount) = match cgroup2_mount() {
        Some(root) => (root, None),
        None => {
            let dir = tempfile::tempdir().unwrap();
            let mounted = Command::new("mount")
                .args(["-t", "cgroup2", "none"])
                .arg(dir.path())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !mounted {
                return None;
            }
            (dir.path().to_path_buf(), Some(dir))
        }
    };
    let cgroup = root.join(format!("das-cdi-hook-test-{}", c.child.id()));
    let made = std::fs::create_dir(&cgroup).is_ok();
    c.made = Some((cgroup.clone(), mount));
    let moved =
        made && std::fs::write(cgroup.join("cgroup.procs"), c.child.id().to_string()).is_ok();
    moved.then_some(c)
}

#[test]
fn the_hook_writes_the_limit_into_the_processs_real_leaf_in_the_fake_tree() {
    let Some(c) = container() else {
        eprintln!(
            "skipped: this test's processes are in the root cgroup and it may not make a cgroup v2 cgroup (run as root)"
        );
        return;
    };
    let pid = c.child.id();
    let leaf_path = cgroup_v2_path(pid);
    assert_ne!(leaf_path, "/");
    let fake = tempfile::tempdir().unwrap();
    let root = fake.path().display().to_string();
    // Another GPU's limit already set on the leaf stays.
    let leaf = fake.path().join(leaf_path.trim_start_matches('/'));
    std::fs::create_dir_all(&leaf).unwrap();
    std::fs::write(
        leaf.join("dmem.max"),
        "nvidia/0000:11:00.0/vidmem 1048576\n",
    )
    .unwrap();
    let (code, text) = hook(
        &[
            "--gpu",
            UUID,
            "--pci-bus-id",
            "00000000:10:00.0",
            "--hard-limit-mib",
            "20480",
            "--cgroup-root",
            &root,
            "--set-with",
            "emulated",
        ],
        &state(pid),
    );
    assert_eq!(code, 0, "{text}");
    assert_eq!(
        std::fs::read_to_string(leaf.join("dmem.max")).unwrap(),
        "nvidia/0000:11:00.0/vidmem 1048576\nnvidia/0000:10:00.0/vidmem 21474836480\n",
        "at {}",
        leaf.display()
    );
    drop(c);
}

#[test]
fn a_dead_pid_fails_the_hook_naming_the_process() {
    let fake = tempfile::tempdir().unwrap();
    let root = fake.path().display().to_string();
    // A pid that has just exited (waited for, so not reused at once).
    let mut gone = Command::new("true").spawn().unwrap();
    let pid = gone.id();
    gone.wait().unwrap();
    let (code, text) = hook(
        &[
            "--gpu",
            UUID,
            "--pci-bus-id",
            "0000:10:00.0",
            "--hard-limit-mib",
            "1",
            "--cgroup-root",
            &root,
            "--set-with",
            "emulated",
        ],
        &state(pid),
    );
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains(&format!("read the container's cgroup /proc/{pid}/cgroup"))
            && text.contains("alive?"),
        "{text}"
    );
    assert!(
        std::fs::read_dir(fake.path()).unwrap().next().is_none(),
        "nothing written"
    );
}

#[test]
fn bad_input_fails_the_hook_saying_what_is_wrong() {
    let args = [
        "--gpu",
        UUID,
        "--pci-bus-id",
        "0000:10:00.0",
        "--hard-limit-mib",
        "1",
        "--set-with",
        "emulated",
    ];
    let (code, text) = hook(&args[..2], "");
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("--pci-bus-id") && text.contains("--hard-limit-mib"),
        "{text}"
    );
    let (code, text) = hook(&args, "{}");
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("the OCI state on standard input is not usable: no pid"),
        "{text}"
    );
    let mut zero = args.to_vec();
    zero[5] = "0";
    let (code, text) = hook(&zero, &state(1));
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("--hard-limit-mib"), "{text}");
    let out = Command::new(env!("CARGO_BIN_EXE_das-kubelet-plugin"))
        .args(["cdi-hook", "cpu-limit"])
        .env_clear()
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("valid is memory-limit"));
}

/// A bundle for `runc run` whose container prints its `/proc/self/cgroup` (a rootfs of the
/// host's `cat` and its libraries) and whose `createRuntime` hook is the built hook with
/// `hook_args`.
fn runc_bundle(dir: &std::path::Path, hook_args: &[String]) {
    let rootfs = dir.join("rootfs");
    for sub in ["bin", "proc", "dev", "sys", "tmp"] {
        std::fs::create_dir_all(rootfs.join(sub)).unwrap();
    }
    let cat = PathBuf::from("/usr/bin/cat");
    std::fs::copy(&cat, rootfs.join("bin/cat")).unwrap();
    let ldd = Command::new("ldd").arg(&cat).output().unwrap();
    for lib in String::from_utf8_lossy(&ldd.stdout)
        .split_whitespace()
        .filter(|w| w.starts_with('/'))
    {
        let to = rootfs.join(lib.trim_start_matches('/'));
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(lib, to).unwrap();
    }
    let spec = Command::new("runc")
        .arg("spec")
        .current_dir(dir)
        .status()
        .unwrap();
    assert!(spec.success());
    let path = dir.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    config["process"]["terminal"] = false.into();
    config["process"]["args"] = serde_json::json!(["/bin/cat", "/proc/self/cgroup"]);
    let mut args = vec![
        "das-kubelet-plugin".to_string(),
        "cdi-hook".into(),
        "memory-limit".into(),
    ];
    args.extend(hook_args.iter().cloned());
    config["hooks"] = serde_json::json!({"createRuntime": [{
        "path": env!("CARGO_BIN_EXE_das-kubelet-plugin"),
        "args": args,
        "timeout": 60,
    }]});
    std::fs::write(&path, serde_json::to_vec_pretty(&config).unwrap()).unwrap();
}

/// Runs the bundle in `dir` with runc; returns its exit status and output.
fn runc_run(dir: &std::path::Path, id: &str) -> (bool, String) {
    let out = Command::new("runc")
        .args(["run", id])
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let _ = Command::new("runc")
        .args(["delete", "-f", id])
        .stderr(Stdio::null())
        .status();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// Under a real OCI runtime (runc, as containerd runs it): the hook runs at `createRuntime` on
/// the container's own leaf, the limit is there before the container's process runs, and a hook
/// that fails keeps the container from starting. Needs runc and root; says so otherwise.
#[test]
fn under_runc_the_limit_is_on_the_containers_leaf_and_a_failed_hook_stops_the_container() {
    let runc = Command::new("runc").arg("--version").output();
    // SAFETY: geteuid only reads the process's credentials.
    let root = unsafe { libc::geteuid() } == 0;
    if !runc.is_ok_and(|o| o.status.success()) || !root {
        eprintln!("skipped: needs runc on PATH and root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("fake-cgroup");
    let hook_args = |set_with: &str| -> Vec<String> {
        [
            "--gpu",
            UUID,
            "--pci-bus-id",
            "0000:10:00.0",
            "--hard-limit-mib",
            "20480",
            "--cgroup-root",
            &fake.display().to_string(),
            "--set-with",
            set_with,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let id = format!("das-cdi-hook-test-{}", std::process::id());
    runc_bundle(dir.path(), &hook_args("emulated"));
    let (ok, text) = runc_run(dir.path(), &id);
    assert!(ok, "{text}");
    // What the container saw as its cgroup v2 path is where the limit is.
    let leaf = text
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .unwrap_or_else(|| panic!("no cgroup v2 line in {text}"));
    assert_ne!(leaf, "/", "{text}");
    let dmem_max = fake.join(leaf.trim_start_matches('/')).join("dmem.max");
    assert_eq!(
        std::fs::read_to_string(&dmem_max)
            .unwrap_or_else(|e| panic!("{}: {e}", dmem_max.display())),
        "nvidia/0000:10:00.0/vidmem 21474836480\n"
    );
    // A hook that fails: the container's process never runs.
    let failing = tempfile::tempdir().unwrap();
    runc_bundle(
        failing.path(),
        &hook_args("nvidia-smi=/nonexistent/nvidia-smi"),
    );
    let (ok, text) = runc_run(failing.path(), &format!("{id}-fails"));
    assert!(!ok, "{text}");
    assert!(!text.contains("0::"), "the container ran: {text}");
    assert!(text.contains("run /nonexistent/nvidia-smi"), "{text}");
}
