//! The life of an MPS control daemon with the emulated GPUs' stand-in (the plugin's binary,
//! `das-kubelet-plugin mps-control-stand-in`): started with its slice and limits, killed and
//! started again with its limits applied again, adopted by a new supervisor (a restarted
//! plugin), stopped with its directories removed. Every wait is on a condition, with a bound.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use das_driver::metrics::Metrics;
use das_driver::mps::stand_in::{Record, Run};
use das_driver::mps::supervisor::MpsSettings;
use das_driver::mps::{Backoff, ControlBinary, MpsDaemons, MpsDirs, MpsLimits, control};

mod common;
use common::{LIMIT, sigkill, until};

const MIG: &str = "MIG-5e4e8557-21de-9c5c-2c37-4564df28091f";

fn daemons(state: &std::path::Path) -> MpsDaemons {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_das-kubelet-plugin"));
    MpsDaemons::new(
        Some(ControlBinary::stand_in(exe)),
        state,
        Arc::new(Metrics::new()),
    )
    .with_backoff(Backoff {
        first: Duration::from_millis(50),
        max: Duration::from_millis(400),
    })
}

fn runs(dirs: &MpsDirs) -> Vec<Run> {
    Record::read(&dirs.log).map(|r| r.runs).unwrap_or_default()
}

fn limit_commands() -> Vec<String> {
    vec![
        "set_default_active_thread_percentage 40".to_string(),
        "set_default_device_pinned_mem_limit 0 2048M".to_string(),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_runs_with_its_limits_comes_back_after_a_kill_and_leaves_nothing_when_stopped() {
    let state = tempfile::tempdir().unwrap();
    let mps = daemons(state.path());
    let limits = MpsLimits {
        active_thread_percentage: Some(40),
        pinned_device_memory_limit_mib: Some(2048),
    };
    let spec = mps.spec("ns/c (uid-1)", "uid-1", "gpu-0-mig-1g-10gb-6", MIG, &limits);
    let dirs = spec.dirs.clone();
    mps.start(spec.clone(), None).await.unwrap();
    assert_eq!(mps.supervised(), 1);
    // Started: pinned to its slice, its limits set before start returned.
    let first = runs(&dirs);
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!(first[0].visible_devices, MIG);
    assert_eq!(first[0].pipe_directory, dirs.pipe.display().to_string());
    assert_eq!(first[0].commands, limit_commands());
    assert!(dirs.control_socket().exists() && dirs.shm.is_dir());
    // The daemon answers as NVIDIA's does; a command it refuses is an error, though the
    // client's status is 0.
    let binary = mps.binary().unwrap().clone();
    let asked = control::send(&binary, &dirs, "get_default_active_thread_percentage").await;
    assert_eq!(asked.unwrap(), "40.0");
    let e = control::send(&binary, &dirs, "bogus_command")
        .await
        .unwrap_err();
    assert!(e.to_string().contains("Unknown command"), "{e}");
    // Starting it again with the same spec keeps the running daemon.
    mps.start(spec.clone(), None).await.unwrap();
    assert_eq!(runs(&dirs).len(), 1);

    // Killed: the supervisor starts it again and applies its limits again, in the same pipe
    // directory (containers have that very directory bind-mounted).
    let pipe_inode = std::fs::metadata(&dirs.pipe).unwrap().ino();
    let pid = mps.pid(&dirs).expect("a live daemon");
    assert_eq!(pid, first[0].pid);
    sigkill(pid);
    let again = until("the daemon started again with its limits", || {
        let r = runs(&dirs);
        (r.len() == 2 && r[1].commands == limit_commands()).then_some(r)
    })
    .await;
    assert_ne!(again[1].pid, pid);
    assert_eq!(again[1].visible_devices, MIG);
    assert_eq!(std::fs::metadata(&dirs.pipe).unwrap().ino(), pipe_inode);

    // A new supervisor (a restarted plugin) adopts the live daemon instead of starting one.
    let new_pid = until("the new daemon's pid file", || mps.pid(&dirs)).await;
    // The old supervisor lets go of it without stopping it, as a plugin that exits does.
    drop(mps);
    let restarted = daemons(state.path());
    assert!(
        restarted
            .bring_back(spec.clone(), Vec::new())
            .await
            .unwrap(),
        "adopted"
    );
    assert_eq!(restarted.pid(&dirs), Some(new_pid));
    let adopted = runs(&dirs);
    assert_eq!(adopted.len(), 2, "no new daemon: {adopted:?}");
    assert_eq!(
        adopted[1].commands[2..],
        limit_commands(),
        "limits applied again"
    );

    // Stopped: `quit`, the process gone, the directories removed.
    restarted.stop(&dirs).await.unwrap();
    assert_eq!(restarted.supervised(), 0);
    assert!(!dirs.root.exists());
    until("the daemon to exit", || gone(new_pid).then_some(())).await;
    // Stopping again is a no-op.
    restarted.stop(&dirs).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_that_cannot_start_is_an_error_and_leaves_nothing() {
    let state = tempfile::tempdir().unwrap();
    let mps = MpsDaemons::new(
        Some(ControlBinary::nvidia(
            state.path().join("no-such-binary"),
            None,
        )),
        state.path(),
        Arc::new(Metrics::new()),
    );
    let spec = mps.spec(
        "ns/c (uid-2)",
        "uid-2",
        "gpu-0-mig-1g-10gb-4",
        MIG,
        &MpsLimits::default(),
    );
    let e = mps.start(spec.clone(), None).await.unwrap_err();
    assert!(e.to_string().contains("no-such-binary"), "{e}");
    assert_eq!(mps.supervised(), 0);
    assert!(!spec.dirs.root.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unrecorded_daemons_are_stopped_at_start_up() {
    let state = tempfile::tempdir().unwrap();
    let mps = daemons(state.path());
    let keep = mps.spec(
        "ns/a (a)",
        "a",
        "gpu-0-mig-1g-10gb-0",
        MIG,
        &MpsLimits::default(),
    );
    let stray = mps.spec(
        "ns/b (b)",
        "b",
        "gpu-0-mig-1g-10gb-2",
        MIG,
        &MpsLimits::default(),
    );
    mps.start(keep.clone(), None).await.unwrap();
    mps.start(stray.clone(), None).await.unwrap();
    let stray_pid = mps.pid(&stray.dirs).unwrap();
    drop(mps);
    let restarted = daemons(state.path());
    assert!(
        restarted
            .bring_back(keep.clone(), Vec::new())
            .await
            .unwrap()
    );
    let stopped = restarted
        .stop_unrecorded(&[keep.id.clone()].into_iter().collect())
        .await;
    assert_eq!(stopped, std::slice::from_ref(&stray.id));
    assert!(!stray.dirs.root.exists());
    until("the stray daemon to exit", || gone(stray_pid).then_some(())).await;
    restarted.stop(&keep.dirs).await.unwrap();
}

/// Whether process `pid` has exited (gone, or a zombie its parent has not reaped yet).
fn gone(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_or(true, |s| s.contains(") Z") || s.contains(") X"))
}

/// The same life with NVIDIA's own daemon, on a GPU node (root, the NVIDIA driver):
/// `DAS_MPS_NVIDIA_BINARY=<path of nvidia-cuda-mps-control> DAS_MPS_UUID=<MIG or GPU UUID>
/// cargo test -p das-driver --test mps_daemon -- --ignored`. Its shm directory is bound over the
/// daemon's `/dev/shm` in a mount namespace of its own, as on real GPUs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an NVIDIA GPU, its driver and root"]
async fn nvidias_daemon_takes_its_limits_comes_back_after_a_kill_and_stops() {
    let (Ok(program), Ok(uuid)) = (
        std::env::var("DAS_MPS_NVIDIA_BINARY"),
        std::env::var("DAS_MPS_UUID"),
    ) else {
        panic!("set DAS_MPS_NVIDIA_BINARY and DAS_MPS_UUID");
    };
    let state = tempfile::tempdir().unwrap();
    let _mounts = common::UnmountBelow(state.path().to_path_buf());
    let binary = ControlBinary::nvidia(PathBuf::from(program), None);
    assert!(binary.shm_over_dev_shm);
    let mps = MpsDaemons::new(Some(binary.clone()), state.path(), Arc::new(Metrics::new()))
        .with_backoff(Backoff {
            first: Duration::from_millis(50),
            max: Duration::from_millis(400),
        })
        .with_settings(MpsSettings {
            shm: das_driver::mps::Shm::Tmpfs {
                size_bytes: 64 << 20,
            },
            ..Default::default()
        });
    let limits = MpsLimits {
        active_thread_percentage: Some(40),
        pinned_device_memory_limit_mib: Some(2048),
    };
    let spec = mps.spec("ns/c (uid-9)", "uid-9", "gpu-0", &uuid, &limits);
    let dirs = spec.dirs.clone();
    let t0 = Instant::now();
    mps.start(spec.clone(), None).await.unwrap();
    println!("started with its limits in {:?}", t0.elapsed());
    let ask = |command: String| {
        let (binary, dirs) = (binary.clone(), dirs.clone());
        async move { control::send(&binary, &dirs, &command).await }
    };
    let percentage = || ask("get_default_active_thread_percentage".into());
    assert_eq!(percentage().await.unwrap(), "40.0");
    let pinned = ask("get_default_device_pinned_mem_limit 0".to_string());
    assert_eq!(pinned.await.unwrap(), "2G");
    assert!(ask("bogus_command".into()).await.is_err());

    let pid = mps.pid(&dirs).unwrap();
    sigkill(pid);
    let t0 = Instant::now();
    loop {
        let new = mps.pid(&dirs).filter(|p| *p != pid);
        if new.is_some() && percentage().await.is_ok_and(|p| p == "40.0") {
            break;
        }
        assert!(t0.elapsed() < LIMIT, "not started again with its limits");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("started again with its limits in {:?}", t0.elapsed());
    assert_eq!(
        das_driver::mps::shm::usage(&dirs.shm).map(|u| u.0),
        Some(64 << 20),
        "its shm is the tmpfs"
    );
    let t0 = Instant::now();
    mps.stop(&dirs).await.unwrap();
    println!("stopped in {:?}", t0.elapsed());
    assert!(!dirs.root.exists());
}

/// Protocol 3 with NVIDIA's own daemon, on a GPU node with driver r615 or newer (root):
/// `DAS_MPS_NVIDIA_BINARY=<path of nvidia-cuda-mps-control> DAS_MPS_UUID=<MIG UUID>
/// cargo test -p das-driver --test mps_daemon protocol_3 -- --ignored --nocapture`. What it
/// checks is what DAS assumes of NVIDIA's v3 interface and has not seen on hardware
/// (docs/operations.md, "MPS: checks for the next GPU"): `-p 3` starts the daemon; the
/// commands as the binary's arguments work; `server create slice --allowed-devices=<MIG UUID>`
/// runs a server `server list` names; a namespace's control socket is at
/// `<pipe>/slice/<namespace>/control`; and after a kill and restart the namespace's directory
/// is the same inode (else running containers' bind mounts would name a directory the new
/// daemon no longer serves).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an NVIDIA GPU with driver r615 or newer, and root"]
async fn nvidias_daemon_speaks_protocol_3_with_a_server_and_a_namespace() {
    use std::os::unix::fs::MetadataExt;
    let (Ok(program), Ok(uuid)) = (
        std::env::var("DAS_MPS_NVIDIA_BINARY"),
        std::env::var("DAS_MPS_UUID"),
    ) else {
        panic!("set DAS_MPS_NVIDIA_BINARY and DAS_MPS_UUID");
    };
    let state = tempfile::tempdir().unwrap();
    let _mounts = common::UnmountBelow(state.path().to_path_buf());
    let binary = ControlBinary::nvidia(PathBuf::from(program), None);
    let mps = MpsDaemons::new(Some(binary), state.path(), Arc::new(Metrics::new()))
        .with_backoff(Backoff {
            first: Duration::from_millis(50),
            max: Duration::from_millis(400),
        })
        .with_settings(MpsSettings {
            protocol: das_driver::mps::Protocol::V3,
            shm: das_driver::mps::Shm::Tmpfs {
                size_bytes: 64 << 20,
            },
            ..Default::default()
        });
    let limits = MpsLimits {
        active_thread_percentage: Some(40),
        pinned_device_memory_limit_mib: Some(2048),
    };
    let spec = mps.spec("ns/c (uid-9)", "uid-9", "gpu-0", &uuid, &limits);
    let dirs = spec.dirs.clone();
    let ns = das_driver::mps::Namespace {
        name: das_driver::mps::commands::namespace_name("uid-9", "gpu-0"),
        limits: MpsLimits {
            active_thread_percentage: Some(25),
            pinned_device_memory_limit_mib: Some(1024),
        },
    };
    mps.start(spec.clone(), Some(ns.clone())).await.unwrap();
    let ns_dir = dirs.namespace_dir(&ns.name);
    let inode = std::fs::metadata(&ns_dir).unwrap().ino();
    println!(
        "{}: {:?}",
        ns_dir.display(),
        std::fs::read_dir(&ns_dir).unwrap().count()
    );
    let pid = mps.pid(&dirs).unwrap();
    sigkill(pid);
    let t0 = Instant::now();
    while mps.pid(&dirs).is_none_or(|p| p == pid) || !ns_dir.join("control").exists() {
        assert!(t0.elapsed() < LIMIT, "not started again with its namespace");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        std::fs::metadata(&ns_dir).unwrap().ino(),
        inode,
        "the namespace's directory was made anew: containers' bind mounts would be stale"
    );
    mps.stop(&dirs).await.unwrap();
    assert!(!dirs.root.exists());
}

/// Protocol 3's silent fallback, closed: a server whose `--allowed-devices` names a device its
/// daemon does not see is created, then exits, and its clients would run without MPS and
/// without limits. The start checks `server list` and fails instead, leaving nothing. (The
/// daemon here sees another device than the slice it is started for: a wrapper changes its
/// `CUDA_VISIBLE_DEVICES`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_protocol_3_server_that_does_not_run_fails_the_start_and_leaves_nothing() {
    let state = tempfile::tempdir().unwrap();
    let exe = env!("CARGO_BIN_EXE_das-kubelet-plugin");
    let elsewhere = ControlBinary {
        program: PathBuf::from("/bin/sh"),
        leading_args: vec![
            "-c".into(),
            format!("CUDA_VISIBLE_DEVICES=GPU-gone exec {exe} mps-control-stand-in \"$@\""),
            "sh".into(),
        ],
        env: Vec::new(),
        shm_over_dev_shm: false,
    };
    let mps = MpsDaemons::new(Some(elsewhere), state.path(), Arc::new(Metrics::new()))
        .with_settings(MpsSettings {
            protocol: das_driver::mps::Protocol::V3,
            ..Default::default()
        });
    let limits = MpsLimits {
        active_thread_percentage: Some(40),
        pinned_device_memory_limit_mib: None,
    };
    let spec = mps.spec("ns/c (uid-1)", "uid-1", "gpu-0-mig-1g-10gb-6", MIG, &limits);
    let ns = das_driver::mps::Namespace {
        name: "c0".into(),
        limits: limits.clone(),
    };
    let e = mps.start(spec.clone(), Some(ns)).await.unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("not running after it was created") && text.contains(MIG),
        "{text}"
    );
    assert_eq!(mps.supervised(), 0);
    assert!(!spec.dirs.root.exists(), "nothing left");

    // The same daemon seeing the slice runs its server: the start succeeds.
    let ok = daemons(state.path()).with_settings(MpsSettings {
        protocol: das_driver::mps::Protocol::V3,
        ..Default::default()
    });
    ok.start(spec.clone(), None).await.unwrap();
    let run = runs(&spec.dirs).pop().unwrap();
    assert_eq!(
        run.commands,
        [
            "server list".to_string(),
            format!("server create slice --allowed-devices={MIG}"),
            "server list".to_string(),
            "server set slice --active-thread-percentage=40".to_string(),
            "namespace list --server=slice".to_string(),
            "server list".to_string(),
        ]
    );
    ok.stop(&spec.dirs).await.unwrap();
}
