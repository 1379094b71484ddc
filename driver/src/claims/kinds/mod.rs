//! Device kinds behind one interface (issue 42): what differs between a MIG instance, a whole GPU
//! and a shared slice is one [`Kind`] each, in its own folder, with its pure decisions beside
//! its I/O. The transaction ([`super::preparer`]: the claim's lock, the checkpoint's changes,
//! roll-back, status, CDI) asks the kind of each device through the registry ([`Kinds`]) and
//! never names a kind itself.
//!
//! Adding a kind: a folder `kinds/<kind>/` whose type implements [`Kind`], one line in
//! [`STANDARD`], and its tests. A kind never imports another (`tools/modgraph.py check`, the
//! isolated rule): what two kinds share is here, in the vocabulary of this module ([`Planned`],
//! [`Holding`], [`GpuTxn`], [`Failed`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use das_api::allocation::MigPlacement;
use das_api::claim_status::DeviceStatusData;
use k8s_openapi::api::resource::v1::DeviceRequestAllocationResult;

use crate::claims::PrepareError;
use crate::claims::cdi::{PreparedGpu, PreparedInstance, SpecDevice};
use crate::claims::checkpoint::{Checkpoint, CheckpointStore, InstanceId, RecordedDevice, Share};
use crate::claims::error::WholeGpuRefusal;
use crate::claims::handler::ClaimRef;
use crate::gpu::{BackendError, GpuCalls, GpuInfo, GpuModel, MigInstance, MigSwitch};
use crate::metrics::Metrics;
use crate::publish::desired::HealthFacts;
use crate::publish::devices::DeviceRef;

pub(crate) mod mig_instance;
pub(crate) mod shared_slice;
pub(crate) mod whole_gpu;

/// Which kind a device is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum KindId {
    /// A MIG instance one claim holds: preparing it creates a MIG instance at exactly its
    /// placement (docs/design.md §7, "Prepare").
    MigInstance,
    /// A GPU with MIG mode off, held whole: nothing is created (docs/design.md §7, "Whole
    /// GPUs").
    WholeGpu,
    /// A share of a shareable MIG instance: the first share creates the MIG instance, later ones join it,
    /// the last one's release destroys it (docs/design.md §7, "Shared slices").
    SharedSlice,
    /// A share of a whole GPU (MIG mode off): several claims hold the GPU, each with its memory
    /// and compute share served by the GPU's MPS daemon; nothing is created (docs/design.md §7,
    /// "Memory slices of a whole GPU").
    SharedWholeGpu,
}

/// A device of a claim's allocation, resolved against what this node publishes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Planned {
    /// Request name of the allocation result (`<request>` or `<request>/<subrequest>`).
    pub request: String,
    /// Pool (this node).
    pub pool: String,
    /// Published device name.
    pub device: String,
    /// Where the device lives.
    pub at: DeviceRef,
    /// The limits of its MPS control daemon, when its claim's config asks for MPS; `None` for
    /// an exclusive device.
    pub mps: Option<crate::mps::MpsLimits>,
    /// The claim's share, when the device is a shareable one.
    pub share: Option<Share>,
    /// The time slice its claim's config asks for, for a whole GPU served with time-slicing.
    pub time_slice: Option<das_api::device_config::TimeSliceInterval>,
}

impl Planned {
    /// Allocation result `r` of published device `at`, exclusive (no MPS, no share yet).
    pub fn of(r: DeviceRequestAllocationResult, at: DeviceRef) -> Self {
        Planned {
            request: r.request,
            pool: r.pool,
            device: r.device,
            at,
            mps: None,
            share: None,
            time_slice: None,
        }
    }
}

/// This node as the request path sees it: what it publishes and how.
pub(crate) struct NodeDevices {
    /// The node's name: the pool of every device it publishes.
    pub(crate) name: String,
    /// Every device the node publishes, by device name ([`crate::publish::devices::device_index`]).
    pub(crate) devices: HashMap<String, DeviceRef>,
    /// The model of each GPU that offers MIG, by index (for the free-placement gauge).
    pub(crate) models: BTreeMap<u32, Arc<GpuModel>>,
    /// The memory of each GPU offered whole, by index, in MiB (what its whole-GPU device
    /// publishes: the bound of an MPS limit on it).
    pub(crate) whole_gpu_memory_mib: BTreeMap<u32, u64>,
    /// The `shares` capacity of every shareable device this node publishes.
    pub(crate) shares_per_slice: u64,
    /// Whether claims of different namespaces may share a MIG instance (docs/design.md §7, "Shares
    /// are a tenant's own").
    pub(crate) shares_across_namespaces: bool,
}

impl NodeDevices {
    /// The one namespace a shared slice of a claim of namespace `ns` may serve: `ns`, or
    /// `None` where shares may cross namespaces.
    pub(crate) fn share_scope<'a>(&self, ns: &'a str) -> Option<&'a str> {
        (!self.shares_across_namespaces).then_some(ns)
    }
}

/// What an allocation result is read against when it is planned: what this node publishes
/// beside the device itself.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PlanCx {
    /// The `shares` capacity of every shareable device this node publishes (a share's
    /// denominator).
    pub shares_per_slice: u64,
}

/// The checkpoint entry of a planned device, before its instance exists (a device of a kind
/// that makes none never has one).
pub fn record(p: &Planned) -> RecordedDevice {
    RecordedDevice {
        kind: p.at.kind,
        request: p.request.clone(),
        pool: p.pool.clone(),
        device: p.device.clone(),
        gpu_index: p.at.gpu_index,
        gpu_uuid: p.at.gpu_uuid.clone(),
        profile: p.at.profile.clone(),
        placement_start: p.at.start,
        placement_size: p.at.size,
        instance: None,
        mps: p.mps.clone(),
        share: p.share.clone(),
        time_slice: p.time_slice,
        acquired: false,
    }
}

/// `d` with the identity of the live instance `s` filled in.
pub fn with_instance(d: &RecordedDevice, s: &MigInstance) -> RecordedDevice {
    RecordedDevice {
        instance: Some(InstanceId {
            gi_id: s.gi_id,
            ci_id: s.ci_id,
            mig_uuid: s.mig_uuid.clone(),
        }),
        ..d.clone()
    }
}

/// Whether live instance `s` is the instance recorded as `d`: same GPU (by UUID), profile,
/// placement, GI ID, and CI ID and MIG UUID — or no MIG UUID at all, which is how the backend
/// lists our GI after a destroy removed its compute instance but failed on the GI. A device of
/// a kind that makes no instance (a whole GPU) is no instance: a live MIG instance on its GPU
/// is never its.
pub fn is_instance(d: &RecordedDevice, s: &MigInstance) -> bool {
    let kinds = Kinds::standard();
    let Some(i) = d
        .instance
        .as_ref()
        .filter(|_| kinds.of_record(d).creates_instance())
    else {
        return false;
    };
    s.gpu_uuid == d.gpu_uuid
        && s.profile == d.profile
        && s.placement.start == d.placement_start
        && s.gi_id == i.gi_id
        && (s.mig_uuid.is_empty() || (s.mig_uuid == i.mig_uuid && s.ci_id == i.ci_id))
}

/// What a prepared device gives a container on its GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Holding {
    /// A MIG device: the live MIG instance created for it.
    Instance(MigInstance),
    /// A whole GPU: the minor of its device node `/dev/nvidia<minor>` (its UUID is the
    /// device's).
    WholeGpu {
        /// Minor of `/dev/nvidia<minor>`.
        minor: u32,
    },
}

impl Holding {
    /// The live MIG instance it is, if any.
    pub fn instance(&self) -> Option<&MigInstance> {
        match self {
            Holding::Instance(s) => Some(s),
            Holding::WholeGpu { .. } => None,
        }
    }

    /// Whether a container can use it now: a GPU instance whose compute instance is gone (an
    /// administrator's `nvidia-smi mig -dci`) is listed without a MIG UUID, and no container
    /// can use it.
    pub fn usable(&self) -> bool {
        self.instance().is_none_or(|s| !s.mig_uuid.is_empty())
    }
}

/// The MIG mode a device needs on its GPU (docs/design.md §7, "MIG mode follows demand").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GpuMode {
    /// MIG mode on: the device is a MIG instance.
    MigOn,
    /// MIG mode off: the device is the GPU itself.
    MigOff,
}

/// Why a kind could not acquire a device on its GPU.
#[derive(Debug)]
pub struct Failed {
    /// The prepare's error, naming the device.
    pub error: PrepareError,
    /// A GPU instance the failed attempt left behind (NVML's create leaves one when the
    /// compute instance fails and so does its clean-up): the roll-back destroys it.
    pub left: Option<InstanceId>,
}

impl From<PrepareError> for Failed {
    fn from(error: PrepareError) -> Self {
        Failed { error, left: None }
    }
}

/// The CDI part of live MIG instance `s` at `at` in its claim's spec (docs/design.md §7,
/// "CDI"): the parent GPU's device node, the GI and CI capability nodes, its MIG UUID.
pub(crate) fn instance_edits(s: &MigInstance, at: CdiPlace<'_>) -> PreparedInstance {
    PreparedInstance {
        mig_uuid: s.mig_uuid.clone(),
        parent_minor: s.gpu_minor,
        gi_cap_minor: s.gi_cap_minor,
        ci_cap_minor: s.ci_cap_minor,
        caps_major: at.caps_major,
        caps_file_mode: Some(0o444),
        request: at.request.to_string(),
        index: at.index,
    }
}

/// The CDI part of the GPU `d` holds whole (a whole GPU, or a share of one): its device node
/// `/dev/nvidia<minor>` and its UUID.
pub(crate) fn gpu_edits(d: &RecordedDevice, h: &Holding, at: CdiPlace<'_>, dev: &mut SpecDevice) {
    if let Holding::WholeGpu { minor } = h {
        dev.gpus.push(PreparedGpu {
            gpu_uuid: d.gpu_uuid.clone(),
            minor: *minor,
            request: at.request.to_string(),
            index: at.index,
        });
    }
}

/// The `status.devices` data of a device holding GPU `d` whole (a whole GPU, or a share of
/// one; reason `GpuPrepared`, profile `gpu`, every memory slice, no instance) and its `Ready`
/// condition's message, which begins with `what` (`whole GPU`, `share of whole GPU`).
pub(crate) fn gpu_status(
    d: &RecordedDevice,
    ready_time: Option<String>,
    what: &str,
) -> (DeviceStatusData, String) {
    let size = i32::try_from(d.placement_size).unwrap_or(i32::MAX);
    let data = DeviceStatusData::whole_gpu(&d.gpu_uuid, size, ready_time);
    (data, format!("{what} {} ({})", d.gpu_index, d.gpu_uuid))
}

/// Checks the devices `whole` that hold a GPU whole (a whole GPU, or a share of one) against
/// the backend's inventory, read now (one read for all of them), before anything is recorded
/// (docs/design.md §7, "Whole GPUs"): each GPU answers, has the UUID it was published with, and
/// MIG mode off or one DAS may switch off, as the request path says since start-up (the switch
/// itself comes later, under the GPU's lock).
///
/// # Errors
/// [`PrepareError::WholeGpuUnavailable`] for the first that cannot be prepared.
pub(crate) async fn whole_gpus_against_inventory(
    whole: &[&Planned],
    cx: &Precheck<'_>,
) -> Result<(), PrepareError> {
    let Some(first) = whole.first() else {
        return Ok(());
    };
    let gpu = first.at.gpu_index;
    let mut inventory = cx.gpus.call(gpu, |b| b.inventory()).await.map_err(|e| {
        PrepareError::WholeGpuUnavailable {
            device: first.device.clone(),
            reason: WholeGpuRefusal::InventoryUnreadable(e).to_string(),
        }
    })?;
    // Whether a GPU may be switched is the request path's to say since start-up.
    for g in &mut inventory {
        g.mig_switch = (cx.switch_of)(g.index);
    }
    for p in whole {
        if let Some(reason) = whole_gpu_unavailable(p, &inventory) {
            return Err(PrepareError::WholeGpuUnavailable {
                device: p.device.clone(),
                reason,
            });
        }
    }
    Ok(())
}

/// Why the GPU `p` holds whole cannot be prepared, given the GPUs as the backend lists them now
/// (a [`WholeGpuRefusal`]'s text); `None` when it can (the GPU answers, has the UUID it was
/// published with, and MIG mode off or [`MigSwitch::Allowed`]).
pub(crate) fn whole_gpu_unavailable(p: &Planned, inventory: &[GpuInfo]) -> Option<String> {
    let (index, uuid) = (p.at.gpu_index, p.at.gpu_uuid.clone());
    let refusal = match inventory.iter().find(|g| g.index == index) {
        None => WholeGpuRefusal::NotInInventory { index, uuid },
        Some(gpu) if gpu.uuid != uuid => WholeGpuRefusal::UuidChanged {
            index,
            now: gpu.uuid.clone(),
            published: uuid,
        },
        Some(gpu) => match (gpu.mig_enabled, &gpu.mig_switch) {
            (true, MigSwitch::Refused(why)) => WholeGpuRefusal::MigModeOn {
                index,
                uuid,
                why: why.clone(),
            },
            _ => return None,
        },
    };
    Some(refusal.to_string())
}

/// Whether `path` is a MIG capability node (`/dev/nvidia-caps/nvidia-cap<N>`): a GI's or CI's,
/// which only the device of that instance has (the parent `/dev/nvidia<N>` every MIG instance of the
/// GPU shares).
pub(crate) fn is_capability_node(path: &str) -> bool {
    path.contains("/nvidia-caps/")
}

/// The `status.devices` data of a device holding a MIG instance, and its `Ready` condition's
/// message (docs/design.md §7, "Device status"), ready since `ready_time`.
pub(crate) fn instance_status(
    d: &RecordedDevice,
    ready_time: Option<String>,
) -> (DeviceStatusData, String) {
    let data = DeviceStatusData {
        mig_uuid: d.mig_uuid().unwrap_or_default().to_string(),
        gpu_uuid: d.gpu_uuid.clone(),
        profile: d.profile.clone(),
        // Placements are at most 8 memory slices (docs/reference/mig.md).
        placement: MigPlacement {
            start: i32::try_from(d.placement_start).unwrap_or(i32::MAX),
            size: i32::try_from(d.placement_size).unwrap_or(i32::MAX),
        },
        gpu_instance_id: d.instance.as_ref().map(|i| i.gi_id),
        compute_instance_id: d.instance.as_ref().map(|i| i.ci_id),
        ready_time,
    };
    let message = format!(
        "MIG {} at memory slice {} on GPU {} ({})",
        d.profile, d.placement_start, d.gpu_index, data.mig_uuid
    );
    (data, message)
}

/// Where a device's CDI edits go in its claim's spec: its request (base name) and its position
/// among the request's devices, in allocation order (it names its `DAS_…_UUID_…` variable).
#[derive(Clone, Copy, Debug)]
pub(crate) struct CdiPlace<'a> {
    /// Base name of the request the device serves (without `/<subrequest>`).
    pub request: &'a str,
    /// Position among the request's devices, counting every kind alike.
    pub index: usize,
    /// Major of the `nvidia-caps` char device.
    pub caps_major: u32,
}

/// What a kind may call and change while it acquires a device of claim `claim` on one GPU,
/// whose lock the transaction holds: the GPU's calls (each timed into
/// `backend_duration_seconds`) and the claim's record.
pub(crate) struct GpuTxn<'a> {
    /// The GPU's index.
    pub gpu: u32,
    /// The claim.
    pub claim: &'a ClaimRef,
    /// The checkpoint: a change made here is saved with the prepare's next write.
    pub checkpoint: &'a CheckpointStore,
    /// This node.
    pub node: &'a NodeDevices,
    calls: &'a GpuCalls,
    metrics: &'a Metrics,
}

impl<'a> GpuTxn<'a> {
    /// Calls on GPU `gpu` (its lock held by the caller) for claim `claim`.
    pub(crate) fn new(
        gpu: u32,
        claim: &'a ClaimRef,
        checkpoint: &'a CheckpointStore,
        node: &'a NodeDevices,
        calls: &'a GpuCalls,
        metrics: &'a Metrics,
    ) -> Self {
        Self {
            gpu,
            claim,
            checkpoint,
            node,
            calls,
            metrics,
        }
    }

    /// Creates the MIG instance of `p` at exactly its placement (metric `create`).
    ///
    /// # Errors
    /// [`PrepareError::Create`] with what the backend answered; a GPU instance the failed
    /// create left behind (its target names a GI ID) is [`Failed::left`], for the roll-back.
    pub async fn create_instance(&self, p: &Planned) -> Result<MigInstance, Failed> {
        let (gpu, profile, start) = (self.gpu, p.at.profile.clone(), p.at.start);
        let t0 = std::time::Instant::now();
        let r = self
            .calls
            .call(gpu, move |b| b.create_instance(gpu, &profile, start))
            .await;
        self.metrics.observe_backend("create", t0.elapsed());
        r.map_err(|e| Failed {
            left: e.target().gi_id.map(|gi_id| InstanceId {
                gi_id,
                ci_id: 0,
                mig_uuid: String::new(),
            }),
            error: PrepareError::create(&p.device, e),
        })
    }

    /// The MIG instances on the GPU now.
    ///
    /// # Errors
    /// What the backend answered.
    pub async fn instances(&self) -> Result<Vec<MigInstance>, BackendError> {
        self.calls.instances_on(self.gpu).await
    }
}

/// What a kind's checks before anything is recorded for a claim may read and call.
pub(crate) struct Precheck<'a> {
    /// The claim.
    pub claim: &'a ClaimRef,
    /// This node.
    pub node: &'a NodeDevices,
    /// The checkpoint (read only).
    pub checkpoint: &'a CheckpointStore,
    /// The GPU calls.
    pub gpus: &'a GpuCalls,
    /// Whether DAS may switch GPU `index`'s MIG mode now (docs/design.md §7, "MIG mode follows
    /// demand").
    pub switch_of: &'a (dyn Fn(u32) -> MigSwitch + Sync),
}

/// One kind of device: everything the transaction needs to know that differs between kinds.
#[tonic::async_trait]
pub trait Kind: Send + Sync + 'static {
    /// Which kind this is.
    fn id(&self) -> KindId;

    /// Whether the published device `at` is of this kind.
    fn serves(&self, at: &DeviceRef) -> bool;

    /// Whether the recorded device `d` is of this kind.
    fn recorded(&self, d: &RecordedDevice) -> bool;

    /// Why an allocated device named `device`, which this node does not publish, cannot be
    /// prepared, when the name is of this kind; `None` when it is not.
    fn unpublished(&self, _device: &str) -> Option<PrepareError> {
        None
    }

    /// Planned device of allocation result `r` of published device `at` (of this kind).
    ///
    /// # Errors
    /// Why the result cannot be prepared as allocated.
    fn plan(
        &self,
        r: DeviceRequestAllocationResult,
        at: DeviceRef,
        _cx: &PlanCx,
    ) -> Result<Planned, PrepareError> {
        Ok(Planned::of(r, at))
    }

    /// Checks planned device `p` once its claim's configs are applied (its MPS limits known).
    ///
    /// # Errors
    /// Why it cannot be prepared so configured.
    fn check(&self, _p: &Planned) -> Result<(), PrepareError> {
        Ok(())
    }

    /// The MIG mode its GPU must have while it is prepared.
    fn gpu_mode(&self) -> GpuMode;

    /// Whether several claims' records may hold one instance of it (each a share): another
    /// holder of the same device is then no holder of its placement (it joins), its release
    /// marks its record `Releasing` before anything else whatever its state (the mark tells the
    /// others it is leaving), and at a rebuild an instance another claim recorded for it is
    /// not that claim's alone.
    fn shared_by_claims(&self) -> bool {
        false
    }

    /// Whose instance `d` of claim `claim_uid` holds, the key of what runs on it (its MPS
    /// daemon): the claim's UID, or for a kind several claims share the shared thing's own name.
    fn owner<'a>(&self, claim_uid: &'a str, _d: &'a RecordedDevice) -> &'a str {
        claim_uid
    }

    /// Whether, releasing `d` of claim `uid`, another claim's record not being released keeps
    /// its instance (and what runs on it): then `d` leaves it to them instead of destroying it.
    fn kept_by_others(&self, _cp: &Checkpoint, _uid: &str, _d: &RecordedDevice) -> bool {
        false
    }

    /// This kind's part of the facts the publisher derives from the records, on this node
    /// (docs/design.md §7, "Shares are a tenant's own"): a function of the checkpoint, called
    /// after every change, that updates `facts` and says whether it changed them; `None` when
    /// the kind derives none here.
    fn record_facts(&self, _node: &NodeDevices) -> Option<RecordFacts> {
        None
    }

    /// Whether preparing it makes (or joins) a MIG instance that its record names: the
    /// instance is then matched by identity, destroyed by its release and counted as claimed.
    fn creates_instance(&self) -> bool;

    /// Whether its claims' containers may share it through MPS (docs/design.md §7, "MPS on a
    /// slice"): a MIG instance (one daemon per instance), or a shared whole GPU (one daemon per
    /// GPU); an exclusive whole GPU is refused.
    fn serves_mps(&self) -> bool {
        self.creates_instance()
    }

    /// The UUID recorded device `d`'s MPS daemon is pinned to (its `CUDA_VISIBLE_DEVICES`, and
    /// protocol 3's `--allowed-devices`), once there is one: its MIG instance's MIG UUID, or
    /// for a shared whole GPU the GPU's UUID. `None` before its instance exists, or for a kind
    /// MPS does not serve.
    fn mps_uuid<'a>(&self, d: &'a RecordedDevice) -> Option<&'a str> {
        d.mig_uuid().filter(|u| self.serves_mps() && !u.is_empty())
    }

    /// Checks a claim's planned devices of this kind (`planned`, never empty) before anything is
    /// recorded for it, and before it waits for the holders of its placements: what fails
    /// here fails at once.
    ///
    /// # Errors
    /// Why the first of them cannot be prepared; nothing was recorded.
    async fn precheck(
        &self,
        _planned: &[&Planned],
        _cx: &Precheck<'_>,
    ) -> Result<(), PrepareError> {
        Ok(())
    }

    /// Acquires planned device `p`, the claim's `i`th, on its GPU (lock held, MIG mode as
    /// [`Self::gpu_mode`] asks): what it then holds. The transaction notes an instance in the
    /// claim's record once this returns it.
    ///
    /// # Errors
    /// [`Failed`]: nothing is held, except what [`Failed::left`] names.
    async fn acquire(&self, i: usize, p: &Planned, tx: &GpuTxn<'_>) -> Result<Holding, Failed>;

    /// What recorded device `d` holds now: `live` is the live instance matched to it, `minor`
    /// the minor of the device node this node publishes for it (`None`: no longer published
    /// as this kind). `None`: it holds nothing (gone, or no longer served).
    fn holding(
        &self,
        d: &RecordedDevice,
        live: Option<&MigInstance>,
        minor: Option<u32>,
    ) -> Option<Holding>;

    /// Adds what `d`, holding `h`, gives a container to its CDI device `dev`.
    fn cdi_edits(&self, d: &RecordedDevice, h: &Holding, at: CdiPlace<'_>, dev: &mut SpecDevice);

    /// Whether the device node at container path `path` of its CDI device is one only it has
    /// (the orphan rule's marks, docs/design.md §7, "A slice leaves its claim"): a container
    /// holding it can still reach the device.
    fn own_node(&self, path: &str) -> bool;

    /// The `status.devices` data of prepared device `d` and its `Ready` condition's message
    /// (docs/design.md §7, "Device status"), ready since `ready_time`.
    fn status(&self, d: &RecordedDevice, ready_time: Option<String>) -> (DeviceStatusData, String);

    /// Whether its devices are carved before bind (published with the binding conditions of
    /// docs/design.md §7, "Carve before bind"): their status entries then carry `SliceReady`.
    fn carved_before_bind(&self) -> bool {
        true
    }
}

/// A kind's part of the facts the publisher derives from the records ([`Kind::record_facts`]).
pub(crate) type RecordFacts = Box<dyn Fn(&Checkpoint, &mut HealthFacts) -> bool + Send + Sync>;

/// The kinds this plugin serves, in the order they are asked (their checks before anything is
/// recorded run in this order too): the first that serves a device is its kind, the last is
/// the base kind. The registration lines.
const STANDARD: &[&dyn Kind] = &[
    &shared_slice::SharedSliceKind,
    &shared_slice::SharedWholeGpuKind,
    &whole_gpu::WholeGpuKind,
    &mig_instance::MigInstanceKind,
];

/// The registry of kinds: which kind a published or recorded device is.
#[derive(Clone, Copy)]
pub struct Kinds {
    all: &'static [&'static dyn Kind],
}

impl std::fmt::Debug for Kinds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.all.iter().map(|k| k.id()))
            .finish()
    }
}

impl Kinds {
    /// The kinds of [`STANDARD`].
    pub fn standard() -> Self {
        Kinds { all: STANDARD }
    }

    /// Every kind, in the order they are asked.
    pub fn all(&self) -> impl Iterator<Item = &'static dyn Kind> + '_ {
        self.all.iter().copied()
    }

    /// Why allocated device `device`, which this node does not publish, cannot be prepared:
    /// the first kind's reason that knows the name, else [`PrepareError::UnknownDevice`].
    pub fn unpublished(&self, device: String) -> PrepareError {
        self.all()
            .find_map(|k| k.unpublished(&device))
            .unwrap_or(PrepareError::UnknownDevice { device })
    }

    /// The kind of published device `at`; the last kind, the base one (a MIG instance), for a
    /// device no other kind serves.
    pub fn of(&self, at: &DeviceRef) -> &'static dyn Kind {
        self.pick(|k| k.serves(at))
    }

    /// The kind of recorded device `d` (as [`Self::of`]).
    pub(crate) fn of_record(&self, d: &RecordedDevice) -> &'static dyn Kind {
        self.pick(|k| k.recorded(d))
    }

    fn pick(&self, is: impl Fn(&dyn Kind) -> bool) -> &'static dyn Kind {
        let base = self.all[self.all.len() - 1];
        self.all.iter().copied().find(|k| is(*k)).unwrap_or(base)
    }
}

#[cfg(test)]
mod tests;
