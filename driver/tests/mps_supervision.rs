//! The supervision of MPS control daemons against what can go wrong with their processes: a
//! pid reused by another process, an MPS server that outlives its daemon, a daemon that does
//! not answer `quit`, one that runs untracked when a prepare is retried, the handover that lets
//! go of them, and a pid file that cannot be written. The daemons are the plugin's stand-in or a
//! small shell script that behaves as NVIDIA's daemon does where it matters here (it starts a
//! "server" in its process group). Every wait is on a condition, with a bound.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use das_driver::metrics::Metrics;
use das_driver::mps::stand_in::Record;
use das_driver::mps::{Backoff, ControlBinary, DaemonSpec, MpsDaemons, MpsLimits, daemon};

mod common;
use common::{running, sigkill, until};

const MIG: &str = "MIG-5e4e8557-21de-9c5c-2c37-4564df28091f";

fn stand_in() -> ControlBinary {
    ControlBinary::stand_in(PathBuf::from(env!("CARGO_BIN_EXE_das-kubelet-plugin")))
}

/// A daemon as a shell script: with `-f` it starts a "server" (`sleep`) in its process group,
/// writes the server's pid to `server.pid` in its log directory, makes its control socket (a
/// plain file: only its presence is looked at) and waits; in client mode it fails, so `quit`
/// never reaches it.
fn scripted() -> ControlBinary {
    let script = r#"
        if [ "$1" = -f ]; then
            sleep 60 &
            echo $! > "$CUDA_MPS_LOG_DIRECTORY/server.pid.tmp"
            mv "$CUDA_MPS_LOG_DIRECTORY/server.pid.tmp" "$CUDA_MPS_LOG_DIRECTORY/server.pid"
            touch "$CUDA_MPS_PIPE_DIRECTORY/control"
            wait
        else
            echo "cannot connect" >&2
            exit 1
        fi"#;
    ControlBinary {
        program: PathBuf::from("/bin/sh"),
        leading_args: vec!["-c".into(), script.into(), "daemon".into()],
        env: Vec::new(),
        shm_over_dev_shm: false,
    }
}

fn daemons(state: &Path, binary: ControlBinary, metrics: Arc<Metrics>) -> MpsDaemons {
    MpsDaemons::new(Some(binary), state, metrics).with_backoff(Backoff {
        first: Duration::from_millis(50),
        max: Duration::from_millis(400),
    })
}

fn spec(mps: &MpsDaemons, limits: MpsLimits) -> DaemonSpec {
    mps.spec("ns/c (uid-1)", "uid-1", "gpu-0-mig-1g-10gb-6", MIG, &limits)
}

fn limits() -> MpsLimits {
    MpsLimits {
        active_thread_percentage: Some(40),
        pinned_device_memory_limit_mib: None,
    }
}

fn server_pid(log: &Path) -> Option<u32> {
    std::fs::read_to_string(log.join("server.pid"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn gauge(metrics: &Metrics, name: &str) -> Option<String> {
    let text = metrics.probe.encode();
    let prefix = format!("das_kubelet_plugin_{name} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix).map(str::to_string))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pid_reused_by_another_process_is_neither_adopted_nor_killed() {
    let state = tempfile::tempdir().unwrap();
    let mps = daemons(state.path(), stand_in(), Arc::new(Metrics::new()));
    let spec = spec(&mps, limits());
    daemon::make_dirs(&spec.dirs).unwrap();
    // The pid file names a live process that is not the daemon (another start time).
    let mut other = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    std::fs::write(&spec.dirs.pid_file, format!("{} 1\n", other.id())).unwrap();
    assert_eq!(daemon::live_pid(&spec.dirs), None);

    assert!(
        !mps.bring_back(spec.clone(), Vec::new()).await.unwrap(),
        "not adopted"
    );
    let started = mps.pid(&spec.dirs).expect("a daemon started");
    assert_ne!(started, other.id());
    mps.stop(&spec.dirs).await.unwrap();
    assert!(running(other.id()), "the other process was killed");
    other.kill().unwrap();
    other.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_that_does_not_answer_quit_is_killed_at_once_with_its_server() {
    let state = tempfile::tempdir().unwrap();
    let metrics = Arc::new(Metrics::new());
    let mps = daemons(state.path(), scripted(), metrics.clone());
    let spec = spec(&mps, MpsLimits::default());
    mps.start(spec.clone(), None).await.unwrap();
    assert_eq!(gauge(&metrics, "mps_daemons_up").as_deref(), Some("1"));
    let server = until("the server", || server_pid(&spec.dirs.log)).await;

    let t0 = Instant::now();
    mps.stop(&spec.dirs).await.unwrap();
    // `quit` failed: no wait for the grace.
    assert!(t0.elapsed() < daemon::QUIT_GRACE, "{:?}", t0.elapsed());
    until("the server to be killed with its daemon", || {
        (!running(server)).then_some(())
    })
    .await;
    assert!(!spec.dirs.root.exists());
    assert_eq!(gauge(&metrics, "mps_daemons_up").as_deref(), Some("0"));
    assert_eq!(gauge(&metrics, "mps_daemons").as_deref(), Some("0"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_of_a_daemon_that_exited_is_killed_before_it_is_started_again() {
    let state = tempfile::tempdir().unwrap();
    let mps = daemons(state.path(), scripted(), Arc::new(Metrics::new()));
    let spec = spec(&mps, MpsLimits::default());
    mps.start(spec.clone(), None).await.unwrap();
    let server = until("the server", || server_pid(&spec.dirs.log)).await;
    let first = mps.pid(&spec.dirs).unwrap();
    // The daemon alone dies; its server would run on.
    sigkill(first);
    until("the first server to be killed", || {
        (!running(server)).then_some(())
    })
    .await;
    let again = until("the daemon started again", || {
        mps.pid(&spec.dirs).filter(|p| *p != first)
    })
    .await;
    assert!(running(again));
    mps.stop(&spec.dirs).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_start_adopts_an_untracked_daemon_and_a_handover_lets_go_of_it() {
    let state = tempfile::tempdir().unwrap();
    let metrics = Arc::new(Metrics::new());
    let mps = daemons(state.path(), stand_in(), metrics.clone());
    let spec = spec(&mps, limits());
    mps.start(spec.clone(), None).await.unwrap();
    let pid = mps.pid(&spec.dirs).unwrap();
    // The handover: supervision ends, the daemon runs on.
    mps.let_go().await;
    assert_eq!(mps.supervised(), 0);
    assert_eq!(gauge(&metrics, "mps_daemons_up").as_deref(), Some("0"));
    assert!(running(pid));

    // A start that finds it (a prepare retried after the first failed past the daemon's start)
    // adopts it with its limits instead of starting a second, untracked daemon.
    let again = daemons(state.path(), stand_in(), Arc::new(Metrics::new()));
    again.start(spec.clone(), None).await.unwrap();
    assert_eq!(again.pid(&spec.dirs), Some(pid));
    let runs = Record::read(&spec.dirs.log).unwrap().runs;
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(
        runs[0].commands,
        [
            "set_default_active_thread_percentage 40",
            "set_default_active_thread_percentage 40"
        ]
    );
    // Adopted and supervised: killed, it is started again.
    sigkill(pid);
    until("the adopted daemon started again", || {
        again.pid(&spec.dirs).filter(|p| *p != pid)
    })
    .await;
    again.stop(&spec.dirs).await.unwrap();
    until("the first daemon gone", || (!running(pid)).then_some(())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_whose_pid_file_cannot_be_written_does_not_outlive_the_error() {
    let state = tempfile::tempdir().unwrap();
    let mps = daemons(state.path(), scripted(), Arc::new(Metrics::new()));
    let spec = spec(&mps, MpsLimits::default());
    daemon::make_dirs(&spec.dirs).unwrap();
    // A directory where the pid file goes: writing it fails.
    std::fs::create_dir(&spec.dirs.pid_file).unwrap();
    let e = das_driver::mps::launch::spawn(mps.binary().unwrap(), &spec)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("daemon.pid"), "{e}");
    // Killed with its group and reaped before the error came back: a server it started, if it
    // got that far, is gone too.
    if let Some(server) = server_pid(&spec.dirs.log) {
        until("the server to be killed", || {
            (!running(server)).then_some(())
        })
        .await;
    }
}
