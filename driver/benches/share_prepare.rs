//! Benchmark: what a prepare costs the plugin for each way a claim holds a slice
//! (docs/design.md §7): an exclusive slice, an MPS slice (its own daemon), the first share of a
//! shared slice (the slice and its daemon) and a share that joins it (neither). The real
//! [`Preparer`] over emulated GPUs (no added latency) and the plugin's stand-in MPS control
//! daemon, with an in-memory API server: what is measured is the plugin's own work (claim
//! resolution, checkpoint writes, creates, daemon start, CDI spec), not the kubelet's call or
//! the API server. Cases run interleaved, round by round, so their ratios come from one run;
//! each prints p50/p99 latency and the plugin's CPU time per prepare (the process's user +
//! system time over the case's prepares; the daemons are other processes).
//!
//! Run: `cargo bench -p das-driver --bench share_prepare` (figures go into docs/benchmarks.md by
//! hand).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use das_driver::claims::checkpoint::{Checkpoint, CheckpointStore};
use das_driver::claims::{BlockingCalls, ClaimRef, OrphanPolicy, Preparer, PreparerConfig};
use das_driver::gpu::{EmulatedBackend, GpuBackend};
use das_driver::metrics::Metrics;
use das_driver::mps::{ControlBinary, MpsDaemons};
use k8s_openapi::api::resource::v1::ResourceClaim;
use serde_json::{Value, json};

const NODE: &str = "n0";
const ROUNDS: usize = 60;

#[path = "../tests/support/claim_store.rs"]
mod claim_store;
use claim_store::ClaimStore;

/// The API server's claims, in memory ([`ClaimStore`]).
type Api = ClaimStore;

impl ClaimStore {
    /// Claim `name` (`uid`), allocated `result`, with `config` for DAS when given.
    fn allocate(&self, name: &str, uid: &str, result: Value, config: Option<Value>) -> ClaimRef {
        let configs: Vec<Value> = config
            .into_iter()
            .map(|p| json!({"source": "FromClaim", "opaque": {"driver": das_api::DRIVER_NAME, "parameters": p}}))
            .collect();
        let rc: ResourceClaim = serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "ns", "uid": uid},
            "spec": {},
            "status": {"allocation": {"devices": {"results": [result], "config": configs}}}
        }))
        .expect("claim");
        self.put(rc)
    }
}

/// The process's user + system CPU time.
fn cpu() -> Duration {
    let mut u = std::mem::MaybeUninit::<libc::rusage>::uninit();
    // SAFETY: getrusage fills the struct it is given.
    let u = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, u.as_mut_ptr());
        u.assume_init()
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// One case's prepares: latencies and CPU.
#[derive(Default)]
struct Case {
    latencies: Vec<Duration>,
    cpu: Duration,
}

impl Case {
    async fn prepare(&mut self, p: &Preparer, c: &ClaimRef) {
        let (t0, c0) = (Instant::now(), cpu());
        p.prepare_claim(c).await.expect("prepare");
        self.latencies.push(t0.elapsed());
        self.cpu += cpu() - c0;
    }

    fn row(&mut self, name: &str) -> String {
        self.latencies.sort();
        let q = |f: f64| self.latencies[((self.latencies.len() - 1) as f64 * f) as usize];
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        format!(
            "| {name} | {:.2} ms | {:.2} ms | {:.2} ms |",
            ms(q(0.5)),
            ms(q(0.99)),
            ms(self.cpu) / self.latencies.len() as f64
        )
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(run());
}

async fn run() {
    let dir = tempfile::tempdir().expect("temp dir");
    let backend: Arc<dyn GpuBackend> = Arc::new(
        EmulatedBackend::open("H100-80GB:1", NODE, &dir.path().join("emu")).expect("GPUs"),
    );
    let api = Arc::new(Api::default());
    let stand_in = ControlBinary::stand_in(PathBuf::from(env!("CARGO_BIN_EXE_das-kubelet-plugin")));
    let mps = Arc::new(MpsDaemons::new(
        Some(stand_in),
        dir.path(),
        Arc::new(Metrics::new()),
    ));
    let path = dir.path().join("checkpoint.json");
    let p = Preparer::new(PreparerConfig {
        api: api.clone(),
        node: NODE.into(),
        inventory: backend.inventory().expect("inventory"),
        time_slicer: das_driver::gpu::TimeSlicer::Backend(backend.clone()),
        backend,
        cdi_dir: dir.path().join("cdi"),
        caps_major: 509,
        device_nodes: das_driver::claims::cdi::DeviceNodes::Omitted,
        driver_mounts: Vec::new(),
        checkpoint: CheckpointStore::new(Checkpoint::new("boot"), path),
        metrics: Arc::new(Metrics::new()),
        blocking: BlockingCalls::Threads,
        orphans: OrphanPolicy::default(),
        mps: mps.clone(),
        share_policy: Default::default(),
        memory_limits: None,
    });
    let result = |device: &str, share: Option<&str>| {
        let mut r = json!({"request": "gpu", "driver": das_api::DRIVER_NAME, "pool": NODE, "device": device});
        if let Some(id) = share {
            r["shareID"] = json!(id);
            r["consumedCapacity"] = json!({"shares": "1", "memory": "2304Mi"});
        }
        r
    };
    let mps_config = json!({"apiVersion": "mig.das.com/v1alpha1", "kind": "MigDeviceConfig",
        "sharing": {"strategy": "MPS", "mps": {"activeThreadPercentage": 50}}});
    let (mut exclusive, mut own, mut first, mut join) = (
        Case::default(),
        Case::default(),
        Case::default(),
        Case::default(),
    );
    for round in 0..ROUNDS {
        let ex = api.allocate(
            "ex",
            &format!("ex-{round}"),
            result("gpu-0-mig-1g-10gb-0", None),
            None,
        );
        let m = api.allocate(
            "mps",
            &format!("mps-{round}"),
            result("gpu-0-mig-1g-10gb-1", None),
            Some(mps_config.clone()),
        );
        let shared = "gpu-0-mig-1g-10gb-2-shared";
        let s1 = api.allocate(
            "s1",
            &format!("s1-{round}"),
            result(shared, Some("a")),
            Some(mps_config.clone()),
        );
        let s2 = api.allocate(
            "s2",
            &format!("s2-{round}"),
            result(shared, Some("b")),
            Some(mps_config.clone()),
        );
        exclusive.prepare(&p, &ex).await;
        own.prepare(&p, &m).await;
        first.prepare(&p, &s1).await;
        join.prepare(&p, &s2).await;
        for c in [&ex, &m, &s2, &s1] {
            p.unprepare_claim(c).await.expect("unprepare");
        }
    }
    println!(
        "prepare, {ROUNDS} rounds interleaved (emulated H100, no added GPU latency; stand-in MPS daemon)"
    );
    println!("| case | p50 | p99 | plugin CPU per prepare |");
    println!("|---|---|---|---|");
    println!("{}", exclusive.row("exclusive slice"));
    println!("{}", own.row("MPS slice (its own daemon)"));
    println!("{}", first.row("first share (slice + daemon)"));
    println!("{}", join.row("joining share"));
    mps.let_go().await;
}
