use std::path::{Path, PathBuf};

use clap::Parser;

use super::hook::{HookArgs, SetWithValue, memory_limit_hook};
use super::install::INSTALLED_HOOK_NAME;
use super::run::{
    DMEM_MAX_FILE, cgroup_v2_path, container_leaf, leaf_dir, read_state, set_emulated,
    with_dmem_limit,
};
use super::*;
use crate::gpu::memory_limits::{DMEM_CAPACITY_FILE, EnforcementChoice, EnforcementSettings};

const UUID: &str = "GPU-2cee9e47-0099-ae43-ff45-2a6b59d21e4a";

fn nvidia_smi() -> SetWith {
    SetWith::NvidiaSmi {
        program: "/usr/bin/nvidia-smi".into(),
        library_dir: Some("/run/nvidia/driver/usr/lib64".into()),
    }
}

#[test]
fn the_hook_runs_this_binary_at_create_runtime_with_the_limit_in_whole_mib() {
    let hook = memory_limit_hook(
        Path::new("/var/lib/kubelet/plugins/mig.das.com/bin/das-kubelet-plugin"),
        UUID,
        "00000000:3B:00.0",
        20 * MIB + MIB / 2,
        Path::new("/sys/fs/cgroup"),
        &nvidia_smi(),
    )
    .unwrap();
    assert_eq!(hook.hook_name, "createRuntime");
    assert_eq!(
        hook.path,
        "/var/lib/kubelet/plugins/mig.das.com/bin/das-kubelet-plugin"
    );
    assert_eq!(
        hook.args,
        [
            "/var/lib/kubelet/plugins/mig.das.com/bin/das-kubelet-plugin",
            "cdi-hook",
            "memory-limit",
            "--gpu",
            UUID,
            "--pci-bus-id",
            "0000:3b:00.0",
            "--hard-limit-mib",
            "20",
            "--cgroup-root",
            "/sys/fs/cgroup",
            "--set-with",
            "nvidia-smi=/usr/bin/nvidia-smi",
            "--library-dir",
            "/run/nvidia/driver/usr/lib64",
        ]
    );
    assert_eq!(hook.timeout, Some(hook::HOOK_TIMEOUT_SECONDS));
    let emulated = memory_limit_hook(
        Path::new("/bin/h"),
        UUID,
        "0000:10:00.0",
        MIB,
        Path::new("/tmp/fake"),
        &SetWith::Emulated,
    )
    .unwrap();
    assert_eq!(
        emulated.args[emulated.args.len() - 2..],
        ["--set-with", "emulated"]
    );
}

#[test]
fn the_hooks_arguments_parse_back_into_what_was_built() {
    for set_with in [nvidia_smi(), SetWith::Emulated] {
        let hook = memory_limit_hook(
            Path::new("/bin/h"),
            UUID,
            "0000:01:00.0",
            4096 * MIB,
            Path::new("/sys/fs/cgroup"),
            &set_with,
        )
        .unwrap();
        // What main() parses: argv[0] and the two subcommand words stand for the program.
        let args = HookArgs::try_parse_from(
            std::iter::once("hook".to_string()).chain(hook.args[3..].iter().cloned()),
        )
        .unwrap();
        assert_eq!(args.gpu, UUID);
        assert_eq!(args.pci_bus_id, "0000:01:00.0");
        assert_eq!(args.hard_limit_mib, 4096);
        assert_eq!(args.cgroup_root, PathBuf::from("/sys/fs/cgroup"));
        assert_eq!(args.set_with(), set_with);
        assert_eq!(args.proc_root, PathBuf::from("/proc"));
    }
}

#[test]
fn a_hook_below_one_mib_or_with_bad_values_is_refused_saying_what_is_valid() {
    let build = |uuid: &str, bus: &str, bytes: u64, hook: &str, root: &str| {
        memory_limit_hook(
            Path::new(hook),
            uuid,
            bus,
            bytes,
            Path::new(root),
            &SetWith::Emulated,
        )
        .unwrap_err()
        .to_string()
    };
    let ok = ("/bin/h", "/sys/fs/cgroup");
    assert_eq!(
        build(UUID, "0000:01:00.0", MIB - 1, ok.0, ok.1),
        "invalid hard limit \"1048575 bytes\": valid is at least 1 MiB (1048576 bytes); a share without memory gets no hook"
    );
    assert!(build(UUID, "0000:01:00.0", 0, ok.0, ok.1).contains("at least 1 MiB"));
    assert!(build("", "0000:01:00.0", MIB, ok.0, ok.1).contains("invalid GPU UUID"));
    assert!(build("GPU-1 x", "0000:01:00.0", MIB, ok.0, ok.1).contains("without blanks"));
    assert_eq!(
        build(UUID, "01:00.0", MIB, ok.0, ok.1),
        "invalid PCI bus ID \"01:00.0\": valid is a bus ID such as 0000:01:00.0"
    );
    assert!(build(UUID, "0000:01:00.0", MIB, "bin/h", ok.1).contains("invalid hook path"));
    assert!(build(UUID, "0000:01:00.0", MIB, ok.0, "cgroup").contains("invalid cgroup root"));
}

#[test]
fn set_with_takes_an_absolute_nvidia_smi_or_emulated_only() {
    let parse = |v: &str| {
        HookArgs::try_parse_from([
            "hook",
            "--gpu",
            UUID,
            "--pci-bus-id",
            "0000:01:00.0",
            "--hard-limit-mib",
            "1",
            "--set-with",
            v,
        ])
    };
    assert_eq!(
        parse("nvidia-smi=/usr/bin/nvidia-smi").unwrap().set_with,
        SetWithValue::NvidiaSmi("/usr/bin/nvidia-smi".into())
    );
    for bad in ["nvidia-smi=nvidia-smi", "nvml", "emulated=1", ""] {
        let err = parse(bad).unwrap_err().to_string();
        assert!(
            err.contains("valid are nvidia-smi=<absolute path of nvidia-smi> and emulated"),
            "{bad}: {err}"
        );
    }
}

#[test]
fn the_oci_state_gives_the_containers_pid() {
    let state = r#"{"ociVersion":"1.2.0","id":"c1","status":"creating","pid":4242,"bundle":"/tmp/b","annotations":{"a":"b"}}"#;
    assert_eq!(read_state(state.as_bytes()).unwrap(), 4242);
    for (bad, says) in [
        ("", "EOF"),
        ("not json", "expected"),
        (
            r#"{"ociVersion":"1.2.0","id":"c1","status":"creating"}"#,
            "no pid",
        ),
        (r#"{"id":"c1","pid":0}"#, "not a process ID"),
        (r#"{"id":"c1","pid":-3}"#, "not a process ID"),
    ] {
        let err = read_state(bad.as_bytes()).unwrap_err().to_string();
        assert!(
            err.starts_with("the OCI state on standard input is not usable"),
            "{err}"
        );
        assert!(err.contains(says), "{bad}: {err}");
    }
}

#[test]
fn the_cgroup_v2_line_gives_the_leaf_and_v1_only_or_malformed_text_is_refused() {
    let hybrid = "12:memory:/kubepods/pod1/abc\n1:name=systemd:/x\n0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-abc.scope\n";
    assert_eq!(
        cgroup_v2_path(hybrid).unwrap(),
        "/kubepods.slice/kubepods-pod1.slice/cri-containerd-abc.scope"
    );
    assert_eq!(cgroup_v2_path("0::/a/b\n").unwrap(), "/a/b");
    assert_eq!(
        leaf_dir(Path::new("/sys/fs/cgroup"), "/a/b"),
        PathBuf::from("/sys/fs/cgroup/a/b")
    );
    let v1 = "12:memory:/docker/abc\n11:cpu,cpuacct:/docker/abc\n";
    assert!(cgroup_v2_path(v1).unwrap_err().contains("only cgroup v1"));
    assert!(cgroup_v2_path("").unwrap_err().contains("only cgroup v1"));
    assert!(
        cgroup_v2_path("garbage\n0::/a\n")
            .unwrap_err()
            .contains("malformed line")
    );
    assert!(
        cgroup_v2_path("0::relative\n")
            .unwrap_err()
            .contains("absolute path")
    );
    assert!(
        cgroup_v2_path("0::/a/../../etc\n")
            .unwrap_err()
            .contains("without ..")
    );
    assert!(
        cgroup_v2_path("0::/\n")
            .unwrap_err()
            .contains("root cgroup")
    );
}

#[test]
fn the_leaf_is_read_from_the_containers_proc_file_and_errors_name_it() {
    let proc = tempfile::tempdir().unwrap();
    let root = Path::new("/sys/fs/cgroup");
    std::fs::create_dir_all(proc.path().join("7")).unwrap();
    std::fs::write(proc.path().join("7/cgroup"), "0::/pod/ctr\n").unwrap();
    assert_eq!(
        container_leaf(proc.path(), 7, root).unwrap(),
        PathBuf::from("/sys/fs/cgroup/pod/ctr")
    );
    std::fs::create_dir_all(proc.path().join("8")).unwrap();
    std::fs::write(proc.path().join("8/cgroup"), "4:memory:/x\n").unwrap();
    let err = container_leaf(proc.path(), 8, root)
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("the container's cgroup is not cgroup v2 ("),
        "{err}"
    );
    assert!(err.contains("8/cgroup"), "{err}");
    let err = container_leaf(proc.path(), 9, root)
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("read the container's cgroup"), "{err}");
    assert!(err.contains("is the container's process 9 alive?"), "{err}");
}

#[test]
fn the_fake_tree_replaces_one_gpus_line_and_keeps_the_others() {
    let other = "nvidia/0000:11:00.0/vidmem 1048576";
    assert_eq!(
        with_dmem_limit("", "0000:10:00.0", 2 * MIB),
        "nvidia/0000:10:00.0/vidmem 2097152\n"
    );
    let before = format!("nvidia/0000:10:00.0/vidmem max\n{other}\n");
    assert_eq!(
        with_dmem_limit(&before, "0000:10:00.0", MIB),
        format!("nvidia/0000:10:00.0/vidmem 1048576\n{other}\n")
    );
    // NVML's spelling of the same GPU in the file is the same GPU.
    assert_eq!(
        with_dmem_limit("nvidia/00000000:10:00.0/vidmem max\n", "0000:10:00.0", MIB),
        "nvidia/0000:10:00.0/vidmem 1048576\n"
    );
    let dir = tempfile::tempdir().unwrap();
    let leaf = dir.path().join("pod/ctr");
    set_emulated(&leaf, "0000:11:00.0", MIB).unwrap();
    set_emulated(&leaf, "0000:10:00.0", 3 * MIB).unwrap();
    set_emulated(&leaf, "0000:10:00.0", 2 * MIB).unwrap();
    assert_eq!(
        std::fs::read_to_string(leaf.join(DMEM_MAX_FILE)).unwrap(),
        format!("{other}\nnvidia/0000:10:00.0/vidmem 2097152\n")
    );
}

/// A stand-in `nvidia-smi` that records its arguments and `LD_LIBRARY_PATH`, and exits with
/// `status` after printing `says` on stderr.
fn stand_in_nvidia_smi(dir: &Path, status: i32, says: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let program = dir.join("nvidia-smi");
    let log = dir.join("args");
    std::fs::write(
        &program,
        format!(
            "#!/bin/sh\nprintf '%s\\n' \"$@\" > {log}\necho \"LD=$LD_LIBRARY_PATH\" >> {log}\necho '{says}' >&2\nexit {status}\n",
            log = log.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    program
}

fn hook_args(set_with: &str, extra: &[&str], proc_root: &Path, root: &Path) -> HookArgs {
    let mut argv = vec![
        "hook".to_string(),
        "--gpu".into(),
        UUID.into(),
        "--pci-bus-id".into(),
        "00000000:10:00.0".into(),
        "--hard-limit-mib".into(),
        "512".into(),
        "--cgroup-root".into(),
        root.display().to_string(),
        "--proc-root".into(),
        proc_root.display().to_string(),
        "--set-with".into(),
        set_with.into(),
    ];
    argv.extend(extra.iter().map(|s| s.to_string()));
    HookArgs::try_parse_from(argv).unwrap()
}

#[test]
fn nvidia_smi_is_asked_for_a_hard_limit_on_the_leaf_with_the_drivers_libraries() {
    let dir = tempfile::tempdir().unwrap();
    let proc = dir.path().join("proc");
    std::fs::create_dir_all(proc.join("77")).unwrap();
    std::fs::write(proc.join("77/cgroup"), "0::/pod/ctr\n").unwrap();
    let program = stand_in_nvidia_smi(dir.path(), 0, "");
    let args = hook_args(
        &format!("nvidia-smi={}", program.display()),
        &["--library-dir", "/drv/lib"],
        &proc,
        Path::new("/sys/fs/cgroup"),
    );
    let state = br#"{"ociVersion":"1.2.0","id":"c","status":"creating","pid":77,"bundle":"/b"}"#;
    let leaf = run::run(&args, &state[..]).unwrap();
    assert_eq!(leaf, PathBuf::from("/sys/fs/cgroup/pod/ctr"));
    let recorded = std::fs::read_to_string(dir.path().join("args")).unwrap();
    assert_eq!(
        recorded.lines().collect::<Vec<_>>(),
        [
            "memory-limits",
            "--set",
            "-n",
            "/sys/fs/cgroup/pod/ctr",
            "--soft-limit",
            "0",
            "--hard-limit",
            "512",
            "-i",
            UUID,
            "LD=/drv/lib",
        ]
    );
    // A refusal is an error with nvidia-smi's words.
    let failing = tempfile::tempdir().unwrap();
    let program = stand_in_nvidia_smi(failing.path(), 4, "Insufficient Permissions");
    let args = hook_args(
        &format!("nvidia-smi={}", program.display()),
        &[],
        &proc,
        Path::new("/sys/fs/cgroup"),
    );
    let err = run::run(&args, &state[..]).unwrap_err().to_string();
    assert_eq!(
        err,
        "nvidia-smi memory-limits exited with status 4: Insufficient Permissions"
    );
    let args = hook_args(
        "nvidia-smi=/nonexistent/nvidia-smi",
        &[],
        &proc,
        Path::new("/x"),
    );
    let err = run::run(&args, &state[..]).unwrap_err().to_string();
    assert!(err.starts_with("run /nonexistent/nvidia-smi"), "{err}");
}

#[test]
fn the_emulated_setter_writes_the_leafs_dmem_max_in_the_fake_tree() {
    let dir = tempfile::tempdir().unwrap();
    let proc = dir.path().join("proc");
    std::fs::create_dir_all(proc.join("5")).unwrap();
    std::fs::write(proc.join("5/cgroup"), "0::/kubepods/pod/ctr\n").unwrap();
    let root = dir.path().join("cgroup");
    let args = hook_args("emulated", &[], &proc, &root);
    let leaf = run::run(&args, &br#"{"id":"c","pid":5}"#[..]).unwrap();
    assert_eq!(leaf, root.join("kubepods/pod/ctr"));
    assert_eq!(
        std::fs::read_to_string(leaf.join(DMEM_MAX_FILE)).unwrap(),
        "nvidia/0000:10:00.0/vidmem 536870912\n"
    );
}

#[test]
fn memory_limits_give_a_hook_only_for_gpus_the_kernel_caps() {
    use crate::gpu::GpuInfo;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join(DMEM_CAPACITY_FILE),
        "nvidia/0000:10:00.0/vidmem 85899345920\n",
    )
    .unwrap();
    let gpu = |index: u32| GpuInfo {
        pci_bus_id: Some(crate::gpu::pci::emulated_bus_id(index)),
        ..GpuInfo::for_tests(index, "H100-80GB")
    };
    let limits = MemoryLimits::decide(
        "/plugins/mig.das.com/bin/das-kubelet-plugin".into(),
        dir.path().to_path_buf(),
        SetWith::Emulated,
        EnforcementSettings {
            choice: EnforcementChoice::Auto,
            cgroup_root: dir.path().to_path_buf(),
            emulated: true,
        },
        &[gpu(0), gpu(1)],
    );
    let hook = limits
        .hook(&gpu(0), 10 * MIB)
        .unwrap()
        .expect("GPU 0 is listed");
    assert!(
        hook.args
            .windows(2)
            .any(|w| w == ["--hard-limit-mib", "10"])
    );
    assert_eq!(
        limits.hook(&gpu(1), 10 * MIB).unwrap(),
        None,
        "GPU 1 is not"
    );
    let no_bus = GpuInfo::for_tests(0, "H100-80GB");
    assert_eq!(limits.hook(&no_bus, 10 * MIB).unwrap(), None);
    assert!(limits.hook(&gpu(0), 1).is_err());
}

#[test]
fn the_hook_is_installed_once_per_content_with_mode_0755() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("exe");
    std::fs::write(&exe, b"binary v1").unwrap();
    let dest = installed_hook_path(&dir.path().join("plugins/mig.das.com"));
    assert!(dest.ends_with("plugins/mig.das.com/bin/das-kubelet-plugin"));
    assert!(install_hook(&exe, &dest).unwrap(), "first install writes");
    assert_eq!(std::fs::read(&dest).unwrap(), b"binary v1");
    let mode = std::fs::metadata(&dest).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o755);
    assert!(
        !install_hook(&exe, &dest).unwrap(),
        "same content: nothing to do"
    );
    std::fs::write(&exe, b"binary v2").unwrap();
    assert!(
        install_hook(&exe, &dest).unwrap(),
        "new content replaces it"
    );
    assert_eq!(std::fs::read(&dest).unwrap(), b"binary v2");
    let leftovers: Vec<_> = std::fs::read_dir(dest.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(leftovers, [INSTALLED_HOOK_NAME], "no temp file left");
    let err = install_hook(&dir.path().join("missing"), &dest).unwrap_err();
    assert!(err.to_string().contains("missing"), "{err}");
}
