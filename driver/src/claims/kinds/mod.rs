//! Device kinds behind one interface (issue 42): what differs between a MIG slice, a whole GPU
//! and a shared slice is one [`Kind`] each, in its own folder, with its pure decisions beside
//! its I/O. The transaction ([`super::preparer`]: the claim's lock, the checkpoint's changes,
//! roll-back, status, CDI) asks the kind of each device through the registry ([`Kinds`]) and
//! never names a kind itself.
//!
//! Adding a kind: a folder `kinds/<kind>/` whose type implements [`Kind`], one line in
//! [`STANDARD`], and its tests. A kind never imports another (`tools/modgraph.py check`, the
//! isolated rule): what two kinds share is here, in the vocabulary of this module ([`Planned`],
//! [`Holding`], [`GpuTxn`], [`Failed`]).

use crate::claims::PrepareError;
use crate::claims::cdi::SpecDevice;
use crate::claims::checkpoint::{InstanceId, RecordedDevice, Share};
use crate::gpu::{BackendError, GpuCalls, MigInstance, MigSwitch};
use crate::metrics::Metrics;
use crate::publish::devices::DeviceRef;

pub(crate) mod mig_instance;
pub(crate) mod whole_gpu;

/// Which kind a device is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KindId {
    /// A MIG slice one claim holds: preparing it creates a MIG instance at exactly its
    /// placement (docs/design.md §7, "Prepare").
    MigInstance,
    /// A GPU with MIG mode off, held whole: nothing is created (docs/design.md §7, "Whole
    /// GPUs").
    WholeGpu,
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
pub enum GpuMode {
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

/// Where a device's CDI edits go in its claim's spec: its request (base name) and its position
/// among the request's devices, in allocation order (it names its `DAS_…_UUID_…` variable).
#[derive(Clone, Copy, Debug)]
pub struct CdiPlace<'a> {
    /// Base name of the request the device serves (without `/<subrequest>`).
    pub request: &'a str,
    /// Position among the request's devices, counting every kind alike.
    pub index: usize,
    /// Major of the `nvidia-caps` char device.
    pub caps_major: u32,
}

/// The GPU calls a kind makes while acquiring a device, on one GPU whose lock the transaction
/// holds: each is timed into `backend_duration_seconds`.
pub struct GpuTxn<'a> {
    /// The GPU's index.
    pub gpu: u32,
    calls: &'a GpuCalls,
    metrics: &'a Metrics,
}

impl<'a> GpuTxn<'a> {
    /// Calls on GPU `gpu` (its lock held by the caller).
    pub fn new(gpu: u32, calls: &'a GpuCalls, metrics: &'a Metrics) -> Self {
        Self {
            gpu,
            calls,
            metrics,
        }
    }

    /// Creates a MIG instance of `profile` at memory slice `start` (metric `create`).
    ///
    /// # Errors
    /// What the backend answered.
    pub async fn create_instance(
        &self,
        profile: &str,
        start: u32,
    ) -> Result<MigInstance, BackendError> {
        let (gpu, profile) = (self.gpu, profile.to_string());
        let t0 = std::time::Instant::now();
        let r = self
            .calls
            .call(gpu, move |b| b.create_instance(gpu, &profile, start))
            .await;
        self.metrics.observe_backend("create", t0.elapsed());
        r
    }
}

/// What a kind's checks before anything is recorded for a claim may read and call.
pub struct Precheck<'a> {
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

    /// The MIG mode its GPU must have while it is prepared.
    fn gpu_mode(&self) -> GpuMode;

    /// Whether preparing it makes (or joins) a MIG instance that its record names: the
    /// instance is then matched by identity, destroyed by its release and counted as claimed.
    fn creates_instance(&self) -> bool;

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

    /// Acquires planned device `p` on its GPU (lock held, MIG mode as [`Self::gpu_mode`]
    /// asks): what it then holds.
    ///
    /// # Errors
    /// [`Failed`]: nothing is held, except what [`Failed::left`] names.
    async fn acquire(&self, p: &Planned, tx: &GpuTxn<'_>) -> Result<Holding, Failed>;

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
}

/// The kinds this plugin serves, in the order they are asked: the first that serves a device
/// is its kind. The registration lines.
const STANDARD: &[&dyn Kind] = &[&whole_gpu::WholeGpuKind, &mig_instance::MigInstanceKind];

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
    pub fn of_record(&self, d: &RecordedDevice) -> &'static dyn Kind {
        self.pick(|k| k.recorded(d))
    }

    fn pick(&self, is: impl Fn(&dyn Kind) -> bool) -> &'static dyn Kind {
        let base = self.all[self.all.len() - 1];
        self.all.iter().copied().find(|k| is(*k)).unwrap_or(base)
    }
}
