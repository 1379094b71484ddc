//! NVML calls of the health monitor on a node of real GPUs, without and with the NVML backend's
//! instance cache (issue 30 item 5; docs/design.md §7, "Health"; docs/nvml.md).
//!
//! The node: 8 × H100-SXM5-80GB with MIG on and four `1g.10gb` instances each, driven through
//! `NvmlBackend` over the fake NVML, which counts the NVML library calls `RealNvml` makes by
//! function name. Ten minutes of simulated time (a clock moved by hand, nothing sleeps) at the
//! monitor's cadence:
//!
//! - every `EVENT_WAIT` (1 s): `wait_health_events` (one `nvmlEventSetWait_v2`, node-wide);
//! - every `INVENTORY_INTERVAL` (5 s): `inventory()` (is every GPU still there) and, per GPU,
//!   `cached_instances_on`, which is what the unclaimed-instance check reads;
//! - on an XID that names a GPU instance: `instances_on` of its GPU (the monitor's
//!   `live_instances`).
//!
//! "no cache" is the backend with `with_instance_refresh(Duration::ZERO)`: every read goes to
//! NVML, as before the cache. Three workloads: steady (nothing changes), churn (every 30 s each
//! GPU's claim is unprepared and prepared again: the request path's `instances_on`, a destroy,
//! a create), and XIDs (one XID naming an instance per GPU per minute).
//!
//! Run: `cargo bench -p das-driver --features testing --bench nvml_inventory`. Prints Markdown
//! tables; deterministic (same figures every run).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use das_driver::gpu::nvml::{
    FakeGpuSpec, FakeNvml, INSTANCE_REFRESH, NvmlBackend, NvmlOptions, RawEvent, event,
};
use das_driver::gpu::{GpuBackend, find_model};
use das_driver::health::monitor::{EVENT_WAIT, INVENTORY_INTERVAL};

const GPUS: u32 = 8;
/// The four `1g.10gb` instances per GPU, where DAS's placement policy puts them (high slices
/// first).
const STARTS: [u32; 4] = [6, 5, 4, 3];
const PROFILE: &str = "1g.10gb";
const MINUTES: u64 = 10;
/// Each GPU's claim is unprepared and prepared again this often in the churn workload.
const CHURN_EVERY: u64 = 30;
/// Each GPU gets an XID naming one of its instances this often in the XID workload.
const XID_EVERY: u64 = 60;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Workload {
    Steady,
    Churn,
    Xids,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::Steady => "steady",
            Workload::Churn => "churn (1 unprepare + prepare / GPU / 30 s)",
            Workload::Xids => "XIDs (1 naming an instance / GPU / min)",
        }
    }
}

/// NVML calls over the run, by what made them.
#[derive(Default)]
struct Tally {
    listing: u64,
    inventory: u64,
    events: u64,
    request_path: u64,
    by_function: BTreeMap<&'static str, u64>,
}

struct Node {
    backend: NvmlBackend<FakeNvml>,
    offset: Arc<Mutex<Duration>>,
    /// A GPU-instance ID of each GPU (what the XIDs name).
    gi: Vec<u32>,
}

impl Node {
    /// The node with its instances made, the call counts as they are then.
    fn new(refresh: Duration) -> Self {
        let model = find_model("H100-SXM5-80GB")
            .expect("embedded GPU models load")
            .expect("H100-SXM5-80GB");
        let fake = FakeNvml::new(
            (0..GPUS)
                .map(|_| FakeGpuSpec::mig(model.clone(), true))
                .collect(),
        );
        let (base, offset) = (Instant::now(), Arc::new(Mutex::new(Duration::ZERO)));
        let now = offset.clone();
        let options = NvmlOptions {
            proc_root: "/nonexistent-proc".into(),
            ..NvmlOptions::default()
        };
        let backend = NvmlBackend::new(fake, options)
            .expect("the fake node")
            .with_instance_refresh(refresh)
            .with_clock(Arc::new(move || base + *now.lock().unwrap()));
        let mut gi = Vec::new();
        for gpu in 0..GPUS {
            for start in STARTS {
                let s = backend
                    .create_instance(gpu, PROFILE, start)
                    .expect("create");
                if start == STARTS[STARTS.len() - 1] {
                    gi.push(s.gi_id);
                }
            }
        }
        Self {
            backend,
            offset,
            gi,
        }
    }

    fn calls(&self) -> u64 {
        self.backend.api().call_total()
    }

    /// NVML calls `f` makes.
    fn count(&self, f: impl FnOnce(&NvmlBackend<FakeNvml>)) -> u64 {
        let before = self.calls();
        f(&self.backend);
        self.calls() - before
    }
}

fn run(workload: Workload, refresh: Duration) -> Tally {
    let node = Node::new(refresh);
    let start_counts = node.backend.api().call_counts();
    let mut t = Tally::default();
    let (wait_s, check_s) = (EVENT_WAIT.as_secs(), INVENTORY_INTERVAL.as_secs());
    for s in (0..MINUTES * 60).step_by(wait_s as usize) {
        if workload == Workload::Churn && s % CHURN_EVERY == CHURN_EVERY / 2 {
            for gpu in 0..GPUS {
                // Unprepare (destroy_pass: list, match, destroy), then the next prepare.
                t.request_path += node.count(|b| {
                    let live = b.instances_on(gpu).expect("list");
                    let s = live
                        .iter()
                        .find(|s| s.placement.start == STARTS[0])
                        .expect("the churned instance");
                    b.destroy_instance(gpu, s.gi_id).expect("destroy");
                    b.create_instance(gpu, PROFILE, STARTS[0]).expect("create");
                });
            }
        }
        if workload == Workload::Xids && s % XID_EVERY == XID_EVERY / 2 {
            for gpu in 0..GPUS {
                node.backend.api().push_event(RawEvent {
                    dev: Some(gpu),
                    event_type: event::XID_CRITICAL_ERROR,
                    data: 94,
                    gpu_instance: Some(node.gi[gpu as usize]),
                });
            }
        }
        if s % check_s == 0 {
            t.inventory += node.count(|b| {
                b.inventory().expect("inventory");
            });
            for gpu in 0..GPUS {
                t.listing += node.count(|b| {
                    b.cached_instances_on(gpu).expect("list");
                });
            }
        }
        let mut named = Vec::new();
        t.events += node.count(|b| {
            let events = b.wait_health_events(EVENT_WAIT).expect("events");
            named = events
                .iter()
                .filter(|e| e.gpu_instance().is_some())
                .map(|e| e.gpu())
                .collect();
        });
        named.dedup();
        for gpu in named {
            t.listing += node.count(|b| {
                b.instances_on(gpu).expect("live instances");
            });
        }
        *node.offset.lock().unwrap() += EVENT_WAIT;
    }
    for (f, n) in node.backend.api().call_counts() {
        let n = n - start_counts.get(f).copied().unwrap_or(0);
        if n > 0 {
            t.by_function.insert(f, n);
        }
    }
    t
}

/// `n` calls over the run, per minute and GPU.
fn per_gpu_minute(n: u64) -> f64 {
    n as f64 / MINUTES as f64 / f64::from(GPUS)
}

fn main() {
    let started = Instant::now();
    let one_listing = {
        let node = Node::new(Duration::ZERO);
        node.count(|b| {
            b.instances_on(0).expect("list");
        })
    };
    let one_inventory = {
        let node = Node::new(Duration::ZERO);
        node.count(|b| {
            b.inventory().expect("inventory");
        }) / u64::from(GPUS)
    };
    println!(
        "{GPUS} × H100-SXM5-80GB, {} × {PROFILE} each; {MINUTES} simulated minutes; events every {} s, checks every {} s, cache refresh {} s.",
        STARTS.len(),
        EVENT_WAIT.as_secs(),
        INVENTORY_INTERVAL.as_secs(),
        INSTANCE_REFRESH.as_secs()
    );
    println!(
        "One GPU's instance listing: {one_listing} NVML calls; one GPU's inventory check: {one_inventory}.\n"
    );
    println!(
        "NVML calls per minute per GPU (event wait: per minute per node; request path: the churn's own calls, the same in both):\n"
    );
    println!(
        "| workload | cache | instance lists | inventory | monitor total / GPU | event wait / node | request path / GPU |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|");
    let mut steady = Vec::new();
    for workload in [Workload::Steady, Workload::Churn, Workload::Xids] {
        for (label, refresh) in [("no cache", Duration::ZERO), ("cache", INSTANCE_REFRESH)] {
            let t = run(workload, refresh);
            println!(
                "| {} | {label} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
                workload.name(),
                per_gpu_minute(t.listing),
                per_gpu_minute(t.inventory),
                per_gpu_minute(t.listing + t.inventory),
                t.events as f64 / MINUTES as f64,
                per_gpu_minute(t.request_path),
            );
            if workload == Workload::Steady {
                steady.push(t.by_function);
            }
        }
    }
    println!(
        "\nSteady workload, NVML calls per minute per GPU by function (event wait per node):\n"
    );
    println!("| function | no cache | cache |");
    println!("|---|---:|---:|");
    let functions: std::collections::BTreeSet<&str> =
        steady.iter().flat_map(|m| m.keys().copied()).collect();
    for f in functions {
        let cell = |m: &BTreeMap<&str, u64>| {
            let n = m.get(f).copied().unwrap_or(0);
            if f == "nvmlEventSetWait_v2" {
                n as f64 / MINUTES as f64
            } else {
                per_gpu_minute(n)
            }
        };
        println!(
            "| `{f}` | {:.1} | {:.1} |",
            cell(&steady[0]),
            cell(&steady[1])
        );
    }
    println!("\n({:.2} s)", started.elapsed().as_secs_f64());
}
