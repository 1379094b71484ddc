//! What an MPS daemon's directories let a client do, on this machine's kernel (needs root:
//! mount(2)): the shm directory is a tmpfs of the configured size (a write past it fails
//! `ENOSPC`), mounted once, kept across a daemon restart and a plugin restart, reported in the
//! metrics, and unmounted when the daemon is stopped; a client reaches the daemon through a
//! read-only bind mount of its pipe directory (a connect needs write permission on the socket's
//! inode, which a read-only mount does not take away) and can create, rename or remove nothing
//! there (`EROFS`), as a container whose CDI mount is `ro`. Every wait is on a condition, with a
//! bound.

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use das_driver::metrics::Metrics;
use das_driver::mps::shm::{self, Shm};
use das_driver::mps::stand_in::Record;
use das_driver::mps::supervisor::{MpsSettings, PipeMount};
use das_driver::mps::{Backoff, ControlBinary, MpsDaemons, MpsLimits, Protocol};
use rustix::mount::{MountFlags, UnmountFlags};

mod common;
use common::{UnmountBelow, root, sigkill, until};

const MIG: &str = "MIG-5e4e8557-21de-9c5c-2c37-4564df28091f";
const SIZE: u64 = 4 << 20;

fn daemons(state: &Path, metrics: Arc<Metrics>, protocol: Protocol) -> MpsDaemons {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_das-kubelet-plugin"));
    MpsDaemons::new(Some(ControlBinary::stand_in(exe)), state, metrics)
        .with_backoff(Backoff {
            first: Duration::from_millis(50),
            max: Duration::from_millis(400),
        })
        .with_settings(MpsSettings {
            protocol,
            shm: Shm::Tmpfs { size_bytes: SIZE },
            pipe_mount: PipeMount::ReadOnly,
        })
}

fn limits() -> MpsLimits {
    MpsLimits {
        active_thread_percentage: Some(40),
        pinned_device_memory_limit_mib: Some(2048),
    }
}

/// The tmpfs mounts on `dir` now (their super block options), from the mount table.
fn tmpfs_on(dir: &Path) -> Vec<String> {
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    shm::parse_mountinfo(&text)
        .into_iter()
        .filter(|e| e.mount_point == dir && e.fs_type == "tmpfs")
        .map(|e| e.super_options)
        .collect()
}

/// Writes `bytes` into `path` 64 KiB at a time; returns the bytes written and the error that
/// stopped it.
fn fill(path: &Path, bytes: u64) -> (u64, Option<std::io::Error>) {
    let mut f = std::fs::File::create(path).unwrap();
    let chunk = vec![7u8; 64 << 10];
    let mut written = 0;
    while written < bytes {
        match f.write_all(&chunk) {
            Ok(()) => written += chunk.len() as u64,
            Err(e) => return (written, Some(e)),
        }
    }
    (written, f.sync_all().err())
}

fn needs_root() {
    assert!(
        root(),
        "these tests mount tmpfs and bind mounts: run them as root"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shm_is_a_tmpfs_of_its_size_kept_across_restarts_and_unmounted_at_the_stop() {
    needs_root();
    let state = tempfile::tempdir().unwrap();
    let _mounts = UnmountBelow(state.path().to_path_buf());
    let metrics = Arc::new(Metrics::new());
    let mps = daemons(state.path(), metrics.clone(), Protocol::V2);
    let spec = mps.spec(
        "ns/c (uid-1)",
        "uid-1",
        "gpu-0-mig-1g-10gb-6",
        MIG,
        &limits(),
    );
    let dirs = spec.dirs.clone();
    mps.start(spec.clone(), None).await.unwrap();

    // One tmpfs of the size, with the mode of /dev/shm.
    let mounted = tmpfs_on(&dirs.shm);
    assert_eq!(mounted.len(), 1, "{mounted:?}");
    assert!(mounted[0].contains("size=4096k"), "{mounted:?}");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&dirs.shm).unwrap().permissions().mode();
    assert_eq!(mode & 0o7777, 0o1777, "the mode of /dev/shm");
    assert_eq!(shm::usage(&dirs.shm).map(|u| u.0), Some(SIZE));
    // A client cannot write past it: the node's disk is never touched.
    let (written, err) = fill(&dirs.shm.join("dataloader"), 2 * SIZE);
    assert_eq!(
        err.map(|e| e.raw_os_error()),
        Some(Some(libc::ENOSPC)),
        "wrote {written}"
    );
    assert!(written <= SIZE, "{written}");
    // Reported while supervised (read at the start and every 15 s after).
    let text = metrics.probe.encode();
    let size_line = format!(
        "das_kubelet_plugin_mps_shm_size_bytes{{daemon=\"{}\"}} {SIZE}",
        spec.id
    );
    assert!(text.contains(&size_line), "{text}");

    // The daemon is killed and started again: the same tmpfs, with what was written in it.
    let pid = mps.pid(&dirs).unwrap();
    sigkill(pid);
    until("the daemon started again", || {
        let runs = Record::read(&dirs.log)?.runs;
        (runs.len() == 2 && mps.pid(&dirs).is_some()).then_some(())
    })
    .await;
    assert_eq!(tmpfs_on(&dirs.shm).len(), 1, "not mounted twice");
    assert!(dirs.shm.join("dataloader").exists(), "the same tmpfs");

    // A restarted plugin adopts the daemon and mounts nothing.
    drop(mps);
    let restarted = daemons(state.path(), metrics.clone(), Protocol::V2);
    assert!(
        restarted
            .bring_back(spec.clone(), Vec::new())
            .await
            .unwrap()
    );
    assert_eq!(tmpfs_on(&dirs.shm).len(), 1, "not mounted twice");

    // Stopped: unmounted, the directory gone, its gauges dropped.
    restarted.stop(&dirs).await.unwrap();
    assert!(tmpfs_on(&dirs.shm).is_empty());
    assert!(!dirs.root.exists());
    let text = metrics.probe.encode();
    assert!(!text.contains(&spec.id), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_left_on_a_plain_directory_keeps_it_and_a_failed_first_start_unmounts() {
    needs_root();
    let state = tempfile::tempdir().unwrap();
    let _mounts = UnmountBelow(state.path().to_path_buf());
    let mps = daemons(state.path(), Arc::new(Metrics::new()), Protocol::V2);
    // Directories an older plugin made, with a plain shm directory its containers have
    // mounted: a start there keeps it as it is.
    let spec = mps.spec(
        "ns/c (uid-2)",
        "uid-2",
        "gpu-0-mig-1g-10gb-6",
        MIG,
        &limits(),
    );
    das_driver::mps::daemon::make_dirs(&spec.dirs).unwrap();
    mps.start(spec.clone(), None).await.unwrap();
    assert!(
        tmpfs_on(&spec.dirs.shm).is_empty(),
        "kept a plain directory"
    );
    mps.stop(&spec.dirs).await.unwrap();

    // A first start that fails (a binary that exits at once) removes what it made: the tmpfs
    // is unmounted with it.
    let broken = MpsDaemons::new(
        Some(ControlBinary {
            program: PathBuf::from("/bin/false"),
            leading_args: Vec::new(),
            env: Vec::new(),
            shm_over_dev_shm: false,
        }),
        state.path(),
        Arc::new(Metrics::new()),
    )
    .with_settings(MpsSettings {
        protocol: Protocol::V2,
        shm: Shm::Tmpfs { size_bytes: SIZE },
        pipe_mount: PipeMount::ReadOnly,
    });
    let spec = broken.spec(
        "ns/c (uid-3)",
        "uid-3",
        "gpu-0-mig-1g-10gb-6",
        MIG,
        &limits(),
    );
    assert!(broken.start(spec.clone(), None).await.is_err());
    assert!(tmpfs_on(&spec.dirs.shm).is_empty() && !spec.dirs.root.exists());
}

/// A read-only bind mount of `dir` at `view` (as a container runtime makes a CDI mount with
/// option `ro`), unmounted when dropped.
struct ReadOnlyView(PathBuf);

impl ReadOnlyView {
    fn new(dir: &Path, view: &Path) -> Self {
        std::fs::create_dir_all(view).unwrap();
        rustix::mount::mount_bind(dir, view).unwrap();
        let me = Self(view.to_path_buf());
        rustix::mount::mount_remount(view, MountFlags::BIND | MountFlags::RDONLY, "").unwrap();
        me
    }
}

impl Drop for ReadOnlyView {
    fn drop(&mut self) {
        let _ = rustix::mount::unmount(&self.0, UnmountFlags::DETACH);
    }
}

/// Asks the control socket at `socket` for the active thread percentage, as the stand-in's
/// clients do.
fn ask_percentage(socket: &Path) -> std::io::Result<String> {
    let mut conn = UnixStream::connect(socket)?;
    conn.write_all(b"get_default_active_thread_percentage\n")?;
    conn.shutdown(std::net::Shutdown::Write)?;
    let mut answer = String::new();
    conn.read_to_string(&mut answer)?;
    Ok(answer.trim().to_string())
}

/// Everything a client could try to change in a pipe directory `view`, each failing `EROFS`.
fn assert_nothing_changes(view: &Path) {
    let erofs = |what: &str, r: std::io::Result<()>| {
        let e = r.expect_err(what);
        assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{what}: {e}");
    };
    erofs(
        "create a file",
        std::fs::File::create(view.join("planted")).map(|_| ()),
    );
    erofs(
        "remove the socket",
        std::fs::remove_file(view.join("control")),
    );
    erofs(
        "rename the socket",
        std::fs::rename(view.join("control"), view.join("moved")),
    );
    erofs("make a directory", std::fs::create_dir(view.join("d")));
    erofs(
        "make a named pipe",
        rustix::fs::mknodat(
            rustix::fs::CWD,
            view.join("fifo"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o666),
            0,
        )
        .map_err(std::io::Error::from),
    );
    erofs(
        "bind a socket",
        std::os::unix::net::UnixListener::bind(view.join("sock")).map(|_| ()),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_reaches_the_daemon_through_a_read_only_pipe_directory_and_changes_nothing() {
    needs_root();
    let state = tempfile::tempdir().unwrap();
    let _mounts = UnmountBelow(state.path().to_path_buf());
    let mps = daemons(state.path(), Arc::new(Metrics::new()), Protocol::V2);
    let spec = mps.spec(
        "ns/c (uid-4)",
        "uid-4",
        "gpu-0-mig-1g-10gb-6",
        MIG,
        &limits(),
    );
    let dirs = spec.dirs.clone();
    mps.start(spec, None).await.unwrap();
    let view = ReadOnlyView::new(&dirs.pipe, &state.path().join("container/tmp/nvidia-mps"));

    // The connect works through the read-only mount: the daemon answers.
    assert_eq!(ask_percentage(&view.0.join("control")).unwrap(), "40.0");
    assert_nothing_changes(&view.0);
    // The daemon's own view is untouched, and it still serves.
    assert!(dirs.control_socket().exists());
    assert!(!dirs.pipe.join("planted").exists());
    assert_eq!(ask_percentage(&dirs.control_socket()).unwrap(), "40.0");
    drop(view);
    mps.stop(&dirs).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_protocol_3_a_client_sees_only_its_namespace_and_gets_its_limits() {
    needs_root();
    let state = tempfile::tempdir().unwrap();
    let _mounts = UnmountBelow(state.path().to_path_buf());
    let mps = daemons(state.path(), Arc::new(Metrics::new()), Protocol::V3);
    let spec = mps.spec(
        "shared slice",
        "GPU-0",
        "gpu-0-mig-1g-10gb-6-shared",
        MIG,
        &limits(),
    );
    let dirs = spec.dirs.clone();
    let ns = |name: &str, percent: u8| das_driver::mps::Namespace {
        name: name.into(),
        limits: MpsLimits {
            active_thread_percentage: Some(percent),
            pinned_device_memory_limit_mib: Some(1024),
        },
    };
    mps.start(spec.clone(), Some(ns("ca", 25))).await.unwrap();
    mps.start(spec, Some(ns("cb", 10))).await.unwrap();
    let view = ReadOnlyView::new(
        &dirs.namespace_dir("ca"),
        &state.path().join("a/nvidia-mps"),
    );

    // Its namespace's control socket, its namespace's limits.
    assert_eq!(ask_percentage(&view.0.join("control")).unwrap(), "25.0");
    // Nothing else of the daemon is in its view: no daemon control socket, no other namespace.
    let names: Vec<String> = std::fs::read_dir(&view.0)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["control"]);
    assert_nothing_changes(&view.0);
    let run = Record::read(&dirs.log).unwrap().runs.pop().unwrap();
    assert_eq!(run.connections, ["slice/ca/control"]);
    drop(view);
    mps.stop(&dirs).await.unwrap();
    let e = ask_percentage(&dirs.namespace_dir("cb").join("control")).unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::NotFound | ErrorKind::ConnectionRefused),
        "{e}"
    );
}
