//! MPS devices through the preparer (docs/design.md §7, "MPS on a slice"), with the emulated
//! GPUs and the plugin's own stand-in control daemon (`das-kubelet-plugin
//! mps-control-stand-in`, which the unit tests' preparer cannot run): a prepare whose daemon
//! does not start is rolled back, an unprepare stops the daemon before it destroys the slice, a
//! retried prepare starts a missing daemon, and start-up brings a recorded daemon back and stops
//! an unrecorded one before it destroys that one's slice. The GPUs here refuse to destroy a
//! slice while a daemon runs on it, as a live MPS server keeps a real slice `IN_USE`. Every wait
//! is on a condition, with a bound.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use das_driver::claims::checkpoint::{Checkpoint, CheckpointStore, LoadOutcome};
use das_driver::claims::{BlockingCalls, ClaimRef, OrphanPolicy, Preparer, PreparerConfig};
use das_driver::gpu::{
    BackendError, EmulatedBackend, GpuBackend, GpuInfo, MigInstance, MigModeState, Target,
};
use das_driver::metrics::Metrics;
use das_driver::mps::stand_in::Record;
use das_driver::mps::supervisor::{MpsSettings, PipeMount};
use das_driver::mps::{
    Backoff, ControlBinary, MpsDaemons, MpsDirs, MpsLimits, Protocol, daemon, layout,
};
use das_driver::publish::resource_slices::SharePolicy;
use k8s_openapi::api::resource::v1::ResourceClaim;
use serde_json::json;

mod common;
use common::{UnmountBelow, running, sigkill, test_shm, until};
#[path = "support/claim_store.rs"]
mod claim_store;
use claim_store::ClaimStore;
#[path = "mps_preparer/shares.rs"]
mod shares;
#[path = "mps_preparer/tenants.rs"]
mod tenants;
#[path = "mps_preparer/v3.rs"]
mod v3;
#[path = "mps_preparer/whole_gpu_shares.rs"]
mod whole_gpu_shares;

const NODE: &str = "n0";
const DEVICE: &str = "gpu-0-mig-1g-10gb-6";

/// The API server's claims, in memory ([`ClaimStore`]): each allocated to one device with an
/// MPS config.
type Api = ClaimStore;

impl ClaimStore {
    /// Claim `ns/<name>` with `uid`, allocated [`DEVICE`] with `sharing: MPS` and both limits.
    fn allocate(&self, name: &str, uid: &str) -> ClaimRef {
        let result = json!({"request": "gpu", "driver": das_api::DRIVER_NAME, "pool": NODE, "device": DEVICE});
        self.allocate_with(name, uid, result, 30)
    }

    /// Claim `ns/<name>` with `uid`, allocated `result` with `sharing: MPS`, active thread
    /// percentage `percent` and a 2Gi pinned memory limit.
    fn allocate_with(
        &self,
        name: &str,
        uid: &str,
        result: serde_json::Value,
        percent: u8,
    ) -> ClaimRef {
        let config = json!({"apiVersion": "mig.das.com/v1alpha1", "kind": "MigDeviceConfig",
            "sharing": {"strategy": "MPS",
                "mps": {"activeThreadPercentage": percent, "pinnedDeviceMemoryLimit": "2Gi"}}});
        let rc: ResourceClaim = serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "ns", "uid": uid},
            "spec": {},
            "status": {
                "allocation": {"devices": {
                    "results": [result],
                    "config": [{"source": "FromClaim",
                        "opaque": {"driver": das_api::DRIVER_NAME, "parameters": config}}]
                }},
                "reservedFor": [{"resource": "pods", "name": format!("{name}-pod"), "uid": format!("pod-{uid}")}]
            }
        }))
        .expect("claim");
        self.put(rc)
    }
}

/// The emulated GPUs, which refuse to destroy a slice while an MPS daemon under `state_dir`
/// runs for it (as NVIDIA's driver refuses while the daemon's server holds the slice), and
/// count the refusals.
struct InUseWhileServed {
    inner: EmulatedBackend,
    state_dir: PathBuf,
    refused: Mutex<Vec<String>>,
    /// When set, the next instance listing says it started (first channel) and waits until
    /// told to go on (second): a test holds a call there while another runs.
    gate: Mutex<Option<(std::sync::mpsc::Sender<()>, std::sync::mpsc::Receiver<()>)>>,
}

impl InUseWhileServed {
    /// The MIG UUIDs the live daemons under the state dir serve (from the stand-in's record).
    fn served(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(self.state_dir.join(layout::MPS_DIR)) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|e| {
                let dirs = MpsDirs::new(&self.state_dir, &e.file_name().to_string_lossy());
                daemon::live_pid(&dirs)?;
                Some(
                    Record::read(&dirs.log)?
                        .runs
                        .last()?
                        .visible_devices
                        .clone(),
                )
            })
            .collect()
    }
}

impl GpuBackend for InUseWhileServed {
    fn inventory(&self) -> Result<Vec<GpuInfo>, BackendError> {
        self.inner.inventory()
    }
    fn gpu_indices(&self) -> Vec<u32> {
        self.inner.gpu_indices()
    }
    fn create_instance(
        &self,
        gpu_index: u32,
        profile: &str,
        start: u32,
    ) -> Result<MigInstance, BackendError> {
        self.inner.create_instance(gpu_index, profile, start)
    }
    fn destroy_instance(&self, gpu_index: u32, gi_id: u32) -> Result<(), BackendError> {
        let live = self.inner.instances_on(gpu_index)?;
        if let Some(i) = live.iter().find(|i| i.gi_id == gi_id)
            && self.served().contains(&i.mig_uuid)
        {
            self.refused.lock().unwrap().push(i.mig_uuid.clone());
            return Err(BackendError::InUse {
                target: Target::gpu(gpu_index),
                reason: "an MPS server runs on it".into(),
            });
        }
        self.inner.destroy_instance(gpu_index, gi_id)
    }
    fn instances_on(&self, gpu_index: u32) -> Result<Vec<MigInstance>, BackendError> {
        let gate = self.gate.lock().unwrap().take();
        if let Some((entered, go_on)) = gate {
            let _ = entered.send(());
            let _ = go_on.recv_timeout(Duration::from_secs(10));
        }
        self.inner.instances_on(gpu_index)
    }
    fn mig_mode(&self, gpu_index: u32) -> Result<MigModeState, BackendError> {
        self.inner.mig_mode(gpu_index)
    }
    fn set_mig_mode(&self, gpu_index: u32, enabled: bool) -> Result<(), BackendError> {
        self.inner.set_mig_mode(gpu_index, enabled)
    }
}

/// One node: its state dir, GPUs and API server, for preparers that come and go (restarts).
struct Node {
    /// Dropped before `dir`: nothing stays mounted below it.
    _mounts: UnmountBelow,
    dir: tempfile::TempDir,
    gpus: Arc<InUseWhileServed>,
    api: Arc<Api>,
}

impl Node {
    fn new() -> Self {
        Self::with_gpus("H100-80GB:1")
    }

    /// A node with the emulated GPUs of `spec`, those with MIG mode off served whole.
    fn with_gpus(spec: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let inner = EmulatedBackend::open(spec, NODE, &dir.path().join("emu"))
            .unwrap()
            .with_whole_gpus(true);
        let gpus = Arc::new(InUseWhileServed {
            inner,
            state_dir: dir.path().to_path_buf(),
            refused: Mutex::new(Vec::new()),
            gate: Mutex::new(None),
        });
        Self {
            _mounts: UnmountBelow(dir.path().to_path_buf()),
            dir,
            gpus,
            api: Arc::new(Api::default()),
        }
    }

    fn stand_in() -> ControlBinary {
        ControlBinary::stand_in(PathBuf::from(env!("CARGO_BIN_EXE_das-kubelet-plugin")))
    }

    /// The daemons of a plugin on this node running `binary`, each with a tmpfs as its shm
    /// ([`test_shm`]), speaking protocol 2.
    fn daemons(&self, binary: ControlBinary) -> Arc<MpsDaemons> {
        self.daemons_with(binary, Protocol::V2)
    }

    /// The same, speaking `protocol`.
    fn daemons_with(&self, binary: ControlBinary, protocol: Protocol) -> Arc<MpsDaemons> {
        Arc::new(
            MpsDaemons::new(Some(binary), self.dir.path(), Arc::new(Metrics::new()))
                .with_backoff(Backoff {
                    first: Duration::from_millis(50),
                    max: Duration::from_millis(400),
                })
                .with_settings(MpsSettings {
                    protocol,
                    shm: test_shm(),
                    pipe_mount: PipeMount::ReadOnly,
                }),
        )
    }

    /// A preparer (a plugin's start) with `mps`, loading the checkpoint if there is one.
    fn preparer(&self, mps: Arc<MpsDaemons>) -> Preparer {
        self.preparer_with(mps, SharePolicy::default())
    }

    /// [`Self::preparer`] with the shared slices cut and scoped by `share_policy`.
    fn preparer_with(&self, mps: Arc<MpsDaemons>, share_policy: SharePolicy) -> Preparer {
        let path = self.dir.path().join("checkpoint.json");
        let checkpoint = match Checkpoint::load(&path, "boot").expect("checkpoint") {
            LoadOutcome::Loaded(cp) => cp,
            LoadOutcome::Fresh => Checkpoint::new("boot"),
            other => panic!("checkpoint: {other:?}"),
        };
        let backend: Arc<dyn GpuBackend> = self.gpus.clone();
        Preparer::new(PreparerConfig {
            api: self.api.clone(),
            node: NODE.into(),
            inventory: backend.inventory().expect("inventory"),
            time_slicer: das_driver::gpu::TimeSlicer::Backend(backend.clone()),
            backend,
            cdi_dir: self.dir.path().join("cdi"),
            caps_major: 509,
            device_nodes: das_driver::claims::cdi::DeviceNodes::Omitted,
            driver_mounts: Vec::new(),
            checkpoint: CheckpointStore::new(checkpoint, path),
            metrics: Arc::new(Metrics::new()),
            blocking: BlockingCalls::Threads,
            orphans: OrphanPolicy::default(),
            mps,
            share_policy,
            memory_limits: None,
        })
    }

    /// Whether the checkpoint on disk records claim `uid`.
    fn recorded(&self, uid: &str) -> bool {
        let text = std::fs::read_to_string(self.dir.path().join("checkpoint.json"))
            .unwrap_or_else(|_| "{}".into());
        let cp: serde_json::Value = serde_json::from_str(&text).unwrap();
        cp["claims"].get(uid).is_some()
    }

    fn slices(&self) -> Vec<MigInstance> {
        self.gpus.instances_on(0).unwrap()
    }

    fn dirs(&self, uid: &str) -> MpsDirs {
        MpsDirs::new(self.dir.path(), &layout::daemon_id(uid, DEVICE))
    }
}

/// The limit commands the stand-in gets for the claims of [`Api::allocate`].
fn limits() -> Vec<String> {
    vec![
        "set_default_active_thread_percentage 30".to_string(),
        "set_default_device_pinned_mem_limit 0 2048M".to_string(),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepare_whose_daemon_does_not_start_is_rolled_back() {
    let node = Node::new();
    // A control binary that exits at once: the daemon never makes its socket.
    let broken = ControlBinary {
        program: PathBuf::from("/bin/false"),
        leading_args: Vec::new(),
        env: Vec::new(),
        shm_over_dev_shm: false,
    };
    let p = node.preparer(node.daemons(broken));
    let claim = node.api.allocate("c", "uid-a");
    let e = p.prepare_claim(&claim).await.unwrap_err();
    assert_eq!(e.metric_label(), "mps_daemon", "{e}");
    assert!(e.to_string().contains("exited at start"), "{e}");
    assert!(node.slices().is_empty(), "the slice is destroyed");
    assert!(!node.recorded("uid-a"), "the record is gone");
    assert!(!node.dirs("uid-a").root.exists(), "the daemon's directory");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unprepare_stops_the_daemon_before_it_destroys_the_slice() {
    let node = Node::new();
    let mps = node.daemons(Node::stand_in());
    let p = node.preparer(mps.clone());
    let claim = node.api.allocate("c", "uid-a");
    p.prepare_claim(&claim).await.unwrap();
    let dirs = node.dirs("uid-a");
    let run = Record::read(&dirs.log).unwrap().runs[0].clone();
    assert_eq!(run.commands, limits());
    assert_eq!(run.visible_devices, node.slices()[0].mig_uuid);
    assert_eq!(mps.supervised(), 1);

    p.unprepare_claim(&claim).await.unwrap();
    assert!(
        node.gpus.refused.lock().unwrap().is_empty(),
        "a destroy came while the daemon ran"
    );
    assert!(node.slices().is_empty() && !node.recorded("uid-a"));
    assert!(!dirs.root.exists() && mps.supervised() == 0);
    until("the daemon to be gone", || {
        (!running(run.pid)).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_prepare_starts_a_missing_daemon_again() {
    let node = Node::new();
    let mps = node.daemons(Node::stand_in());
    let p = node.preparer(mps.clone());
    let claim = node.api.allocate("c", "uid-a");
    p.prepare_claim(&claim).await.unwrap();
    let dirs = node.dirs("uid-a");
    let first = mps.pid(&dirs).expect("a daemon");
    // The daemon is gone and nothing supervises it (as after a plugin restart whose start of
    // it failed): the kubelet's retry of the prepare starts it with its limits.
    mps.stop(&dirs).await.unwrap();
    assert!(!running(first) || mps.pid(&dirs).is_none());
    p.prepare_claim(&claim).await.unwrap();
    let again = mps.pid(&dirs).expect("the daemon started again");
    assert_ne!(again, first);
    assert!(mps.is_supervised(&layout::daemon_id("uid-a", DEVICE)));
    let runs = Record::read(&dirs.log).unwrap().runs;
    assert_eq!(runs.last().unwrap().commands, limits());
    assert_eq!(node.slices().len(), 1, "the same slice");
    p.unprepare_claim(&claim).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_brings_a_recorded_daemon_back_and_stops_an_unrecorded_one_first() {
    let node = Node::new();
    let mps = node.daemons(Node::stand_in());
    let p = node.preparer(mps.clone());
    let claim = node.api.allocate("c", "uid-a");
    p.prepare_claim(&claim).await.unwrap();
    let recorded = node.dirs("uid-a");
    let old = mps.pid(&recorded).unwrap();
    // A slice and daemon no record holds (a plugin that stopped between starting them and
    // recording them): the slice cannot be destroyed while its daemon runs.
    let orphan = node.gpus.create_instance(0, "1g.10gb", 0).unwrap();
    let spec = mps.spec(
        "ns/gone (uid-x)",
        "uid-x",
        DEVICE,
        &orphan.mig_uuid,
        &MpsLimits::default(),
    );
    let unrecorded = spec.dirs.clone();
    mps.start(spec, None).await.unwrap();
    let stray = mps.pid(&unrecorded).unwrap();

    // The plugin restarts: the old instance lets go of its daemons, the recorded one dies.
    mps.let_go().await;
    drop(p);
    drop(mps);
    sigkill(old);
    until("the old daemon to die", || (!running(old)).then_some(())).await;
    let mps = node.daemons(Node::stand_in());
    let p = node.preparer(mps.clone());
    let report = p.reconcile_at_startup(false, true).await.unwrap();

    // The recorded daemon runs again with its limits.
    let back = mps.pid(&recorded).expect("the recorded daemon back");
    assert_ne!(back, old);
    let runs = Record::read(&recorded.log).unwrap().runs;
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert_eq!(runs[1].commands, limits());
    // The unrecorded one was stopped before its slice was destroyed.
    until("the unrecorded daemon to exit", || {
        (!running(stray)).then_some(())
    })
    .await;
    assert!(!unrecorded.root.exists());
    assert!(
        node.gpus.refused.lock().unwrap().is_empty(),
        "a destroy came while the unrecorded daemon ran"
    );
    let left: Vec<String> = node.slices().into_iter().map(|i| i.mig_uuid).collect();
    assert!(!left.contains(&orphan.mig_uuid), "{report:?}");
    assert_eq!(left.len(), 1, "the recorded slice is kept");
    p.unprepare_claim(&claim).await.unwrap();
}

/// Issue 41 item 7: a GPU that does not answer at start-up skips its claims' daemons; the
/// reaper's passes bring them back once it answers, with their limits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_start_up_skipped_comes_back_once_its_gpu_answers() {
    let node = Node::new();
    let mps = node.daemons(Node::stand_in());
    let p = node.preparer(mps.clone());
    let claim = node.api.allocate("c", "uid-a");
    p.prepare_claim(&claim).await.unwrap();
    let recorded = node.dirs("uid-a");
    let old = mps.pid(&recorded).unwrap();
    mps.let_go().await;
    drop(p);
    drop(mps);
    sigkill(old);
    until("the old daemon to die", || (!running(old)).then_some(())).await;
    // The plugin restarts while the GPU does not answer: the claim is kept, its daemon not
    // started.
    node.gpus.inner.set_gpu_lost(0, true);
    let mps = node.daemons(Node::stand_in());
    let p = node.preparer(mps.clone());
    let report = p.reconcile_at_startup(false, false).await.unwrap();
    assert_eq!(report.unavailable_gpus, [0]);
    assert_eq!(mps.pid(&recorded), None);
    assert!(
        p.retry_pending_mps().await.is_empty(),
        "the GPU still does not answer"
    );
    // It answers again: the next pass brings the daemon back.
    node.gpus.inner.set_gpu_lost(0, false);
    assert_eq!(p.retry_pending_mps().await, ["uid-a"]);
    let back = mps.pid(&recorded).expect("the daemon back");
    assert_ne!(back, old);
    let runs = Record::read(&recorded.log).unwrap().runs;
    assert_eq!(runs.last().unwrap().commands, limits());
    assert!(p.retry_pending_mps().await.is_empty(), "done once");
    p.unprepare_claim(&claim).await.unwrap();
}
