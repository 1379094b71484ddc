//! MPS daemons started through the MPS host (`das-kubelet-plugin mps-host`, the built binary
//! run as a process of its own, as the `das-mps-host` pod runs it): they are the host's
//! children, not the plugin's, so a plugin that goes away (its `MpsDaemons` dropped, as at a
//! crash, or let go, as at a handover) leaves them running, and the next plugin adopts them
//! by their pid file; supervision (a restart after an exit) and stops still work through
//! the host. Also the benchmark of docs/benchmarks.md, "MPS host" (ignored; run with
//! `--ignored --nocapture`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use das_driver::metrics::Metrics;
use das_driver::mps::host::{self, HostClient};
use das_driver::mps::launch::Launch;
use das_driver::mps::stand_in::Record;
use das_driver::mps::{Backoff, ControlBinary, DaemonSpec, MpsDaemons, MpsLimits, daemon};

mod common;
use common::{running, sigkill, until};

const MIG: &str = "MIG-5e4e8557-21de-9c5c-2c37-4564df28091f";
const EXE: &str = env!("CARGO_BIN_EXE_das-kubelet-plugin");

/// The host process of `state`, killed when dropped.
struct HostProcess(Child);

impl HostProcess {
    async fn start(state: &Path) -> Self {
        let child = Command::new(EXE)
            .args([host::SUBCOMMAND, "--state-dir"])
            .arg(state)
            .env("DAS_LOG_LEVEL", "warn")
            .stdin(Stdio::null())
            .spawn()
            .expect("run the MPS host");
        let socket = host::socket_path(state);
        until("the host's socket", || socket.exists().then_some(())).await;
        Self(child)
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for HostProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A plugin's daemons, started through the host of `state`.
fn daemons(state: &Path) -> MpsDaemons {
    MpsDaemons::new(
        Some(ControlBinary::stand_in(PathBuf::from(EXE))),
        state,
        Arc::new(Metrics::new()),
    )
    .with_backoff(Backoff {
        first: Duration::from_millis(50),
        max: Duration::from_millis(400),
    })
    .with_host(Some(host::socket_path(state)))
}

fn spec(mps: &MpsDaemons) -> DaemonSpec {
    let limits = MpsLimits {
        active_thread_percentage: Some(40),
        pinned_device_memory_limit_mib: None,
    };
    mps.spec("ns/c (uid-1)", "uid-1", "gpu-0-mig-1g-10gb-6", MIG, &limits)
}

/// The parent pid of `pid` (field 4 of `/proc/<pid>/stat`).
fn parent(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_of_the_host_outlives_its_plugin_and_the_next_plugin_adopts_it() {
    let state = tempfile::tempdir().unwrap();
    let h = HostProcess::start(state.path()).await;
    let client = HostClient::new(host::socket_path(state.path()));

    let first = daemons(state.path());
    let spec = spec(&first);
    first.start(spec.clone(), None).await.unwrap();
    let pid = first.pid(&spec.dirs).expect("a daemon");
    assert_eq!(
        parent(pid),
        Some(h.pid()),
        "the host's child, not the plugin's"
    );
    assert_eq!(client.list().await.unwrap()[0].pid, pid);

    // The plugin crashes: its supervision ends with it, and nothing is killed.
    drop(first);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(running(pid), "the daemon outlived its plugin");

    // The next plugin brings it back: the same process, its limits applied again.
    let next = daemons(state.path());
    assert!(
        next.bring_back(spec.clone(), Vec::new()).await.unwrap(),
        "adopted"
    );
    assert_eq!(next.pid(&spec.dirs), Some(pid));
    let runs = Record::read(&spec.dirs.log).unwrap().runs;
    assert_eq!(runs.len(), 1, "one run of the daemon: {runs:?}");
    assert_eq!(
        runs[0].commands,
        [
            "set_default_active_thread_percentage 40",
            "set_default_active_thread_percentage 40"
        ]
    );

    // A handover (let_go) kills nothing either, and a third plugin adopts it too.
    next.let_go().await;
    assert!(running(pid));
    let third = daemons(state.path());
    assert!(third.bring_back(spec.clone(), Vec::new()).await.unwrap());
    assert_eq!(third.pid(&spec.dirs), Some(pid));

    // Supervised by pid: killed, it is started again through the host, with its limits.
    sigkill(pid);
    let again = until("the daemon started again", || {
        third.pid(&spec.dirs).filter(|p| *p != pid)
    })
    .await;
    assert_eq!(parent(again), Some(h.pid()));
    until("the host to reap the first", || {
        (parent(pid).is_none()).then_some(())
    })
    .await;
    let runs = until("the second run's limits", || {
        let runs = Record::read(&spec.dirs.log)?.runs;
        (runs.len() == 2 && !runs[1].commands.is_empty()).then_some(runs)
    })
    .await;
    assert_eq!(
        runs[1].commands,
        ["set_default_active_thread_percentage 40"]
    );

    // A stop through the third plugin ends it; the host reaps it.
    third.stop(&spec.dirs).await.unwrap();
    assert!(!spec.dirs.root.exists());
    until("the host to have no daemon", || {
        (parent(again).is_none()).then_some(())
    })
    .await;
    assert!(client.list().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_host_a_start_fails_naming_it_and_leaves_nothing() {
    let state = tempfile::tempdir().unwrap();
    let mps = daemons(state.path());
    let spec = spec(&mps);
    let e = mps.start(spec.clone(), None).await.unwrap_err();
    assert!(e.0.contains("host.sock could not be reached"), "{e}");
    assert!(e.0.contains("das-mps-host"), "{e}");
    assert!(
        !spec.dirs.root.exists(),
        "the first start's directories are removed"
    );
    assert_eq!(mps.supervised(), 0);
}

/// Wall time of `f` and the CPU time it cost this process (user + system, from getrusage).
fn cpu_self() -> Duration {
    // SAFETY: getrusage writes into the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// CPU time of process `pid` so far (utime + stime of `/proc/<pid>/stat`).
fn cpu_of(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let f: Vec<u64> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .skip(11)
        .take(2)
        .map(|v| v.parse().unwrap())
        .collect();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    Duration::from_micros((f[0] + f[1]) * 1_000_000 / hz)
}

fn summary(name: &str, mut walls: Vec<Duration>, cpu: Duration) {
    walls.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let n = walls.len();
    println!(
        "{name:<32} n={n} wall median {:.2} ms p90 {:.2} ms max {:.2} ms; CPU {:.2} ms/spawn",
        ms(walls[n / 2]),
        ms(walls[n * 9 / 10]),
        ms(walls[n - 1]),
        ms(cpu) / n as f64
    );
}

/// The added prepare latency of a start through the host: N spawns of the stand-in daemon
/// directly (the plugin's child) and N through the host, each timed to the spawn's return
/// and to the daemon's control socket (what a prepare waits for before it sends the limits).
/// `cargo test -p das-driver --test mps_host -- --ignored --nocapture spawn_latency`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: prints figures"]
async fn spawn_latency() {
    const N: usize = 50;
    let state = tempfile::tempdir().unwrap();
    let h = HostProcess::start(state.path()).await;
    let client = HostClient::new(host::socket_path(state.path()));
    let mps = daemons(state.path());
    let bin = mps.binary().unwrap().clone();
    let specs: Vec<DaemonSpec> = (0..N)
        .map(|i| mps.spec("ns/c", &format!("uid-{i}"), "d", MIG, &MpsLimits::default()))
        .collect();
    for s in &specs {
        daemon::make_dirs(&s.dirs).unwrap();
    }
    let ready = |s: &DaemonSpec| {
        let socket = s.dirs.control_socket();
        async move { until("the control socket", || socket.exists().then_some(())).await }
    };

    let (mut spawn_w, mut ready_w) = (Vec::new(), Vec::new());
    let cpu0 = cpu_self();
    for s in &specs {
        let t0 = Instant::now();
        let mut child = das_driver::mps::launch::spawn(&bin, s).await.unwrap();
        spawn_w.push(t0.elapsed());
        ready(s).await;
        ready_w.push(t0.elapsed());
        let _ = child.kill().await;
    }
    let direct_cpu = cpu_self() - cpu0;
    summary("direct: spawn", spawn_w, direct_cpu);
    summary("direct: spawn to socket", ready_w, direct_cpu);

    let (mut spawn_w, mut ready_w) = (Vec::new(), Vec::new());
    let (cpu0, host0) = (cpu_self(), cpu_of(h.pid()));
    for s in &specs {
        let t0 = Instant::now();
        let d = client.spawn(&Launch::new(&bin, s)).await.unwrap();
        spawn_w.push(t0.elapsed());
        ready(s).await;
        ready_w.push(t0.elapsed());
        client.kill(d.pid).await.unwrap();
    }
    let (plugin_cpu, host_cpu) = (cpu_self() - cpu0, cpu_of(h.pid()) - host0);
    summary("host: spawn", spawn_w, plugin_cpu + host_cpu);
    summary("host: spawn to socket", ready_w, plugin_cpu + host_cpu);
    println!(
        "host CPU {:.2} ms/spawn, plugin (test process) CPU {:.2} ms/spawn (getrusage; the host's from /proc, clock ticks)",
        host_cpu.as_secs_f64() * 1000.0 / N as f64,
        plugin_cpu.as_secs_f64() * 1000.0 / N as f64
    );
}

/// The same with NVIDIA's own daemon, on a GPU node (root, the NVIDIA driver):
/// `DAS_MPS_NVIDIA_BINARY=<path of nvidia-cuda-mps-control> DAS_MPS_UUID=<MIG or GPU UUID>
/// cargo test -p das-driver --test mps_host nvidia -- --ignored --nocapture`. The host starts
/// it in a mount namespace of its own with its shm tmpfs (mounted by the "plugin", this test)
/// over its `/dev/shm`; it takes its limits, outlives its plugin, is adopted with them by the
/// next, and stops. Prints how long each start took, through the host and directly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an NVIDIA GPU, its driver and root"]
async fn nvidias_daemon_through_the_host_outlives_its_plugin() {
    use das_driver::mps::control;
    use das_driver::mps::supervisor::MpsSettings;
    let (Ok(program), Ok(uuid)) = (
        std::env::var("DAS_MPS_NVIDIA_BINARY"),
        std::env::var("DAS_MPS_UUID"),
    ) else {
        panic!("set DAS_MPS_NVIDIA_BINARY and DAS_MPS_UUID");
    };
    let state = tempfile::tempdir().unwrap();
    let _mounts = common::UnmountBelow(state.path().to_path_buf());
    let h = HostProcess::start(state.path()).await;
    let binary = ControlBinary::nvidia(PathBuf::from(program), None);
    let plugin = |host: bool| {
        let socket = host.then(|| host::socket_path(state.path()));
        MpsDaemons::new(Some(binary.clone()), state.path(), Arc::new(Metrics::new()))
            .with_settings(MpsSettings {
                shm: das_driver::mps::Shm::Tmpfs {
                    size_bytes: 64 << 20,
                },
                ..Default::default()
            })
            .with_host(socket)
    };
    let limits = MpsLimits {
        active_thread_percentage: Some(40),
        pinned_device_memory_limit_mib: None,
    };
    let percentage = |dirs: das_driver::mps::MpsDirs| {
        let binary = binary.clone();
        async move { control::send(&binary, &dirs, "get_default_active_thread_percentage").await }
    };

    // Directly, for the comparison.
    let direct = plugin(false);
    let spec = direct.spec("ns/c (uid-8)", "uid-8", "gpu-0", &uuid, &limits);
    let t0 = Instant::now();
    direct.start(spec.clone(), None).await.unwrap();
    println!("direct: started with its limits in {:?}", t0.elapsed());
    direct.stop(&spec.dirs).await.unwrap();

    let first = plugin(true);
    let spec = first.spec("ns/c (uid-9)", "uid-9", "gpu-0", &uuid, &limits);
    let t0 = Instant::now();
    first.start(spec.clone(), None).await.unwrap();
    println!(
        "through the host: started with its limits in {:?}",
        t0.elapsed()
    );
    let pid = first.pid(&spec.dirs).unwrap();
    assert_eq!(parent(pid), Some(h.pid()));
    assert_eq!(percentage(spec.dirs.clone()).await.unwrap(), "40.0");
    drop(first);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(running(pid), "NVIDIA's daemon outlived its plugin");
    let next = plugin(true);
    assert!(next.bring_back(spec.clone(), Vec::new()).await.unwrap());
    assert_eq!(next.pid(&spec.dirs), Some(pid));
    assert_eq!(percentage(spec.dirs.clone()).await.unwrap(), "40.0");
    next.stop(&spec.dirs).await.unwrap();
    assert!(!spec.dirs.root.exists());
    until("the daemon gone", || (!running(pid)).then_some(())).await;
}
