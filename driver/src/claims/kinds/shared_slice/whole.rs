//! A share of a whole GPU (docs/design.md §7, "Memory slices of a whole GPU"): the device
//! `gpu-<i>-shared` of a GPU with MIG mode off (or without MIG), allocated to several claims,
//! each with a share (`shareID`, consumed `shares` and `memory`). Nothing is created: each share
//! holds the GPU's device node as a whole GPU does, and the GPU's one MPS control daemon (its
//! UUID, `--allowed-devices` with protocol 3) holds each share to its memory and compute
//! (the MPS layer); the last share's release stops it. The checkpoint's records are the
//! reference count, the tenancy rule is the shared slices' ([`super::plan`], [`super::tenants`]),
//! and a share that holds the GPU is marked acquired under its lock ([`super::acquire::hold_gpu`]).

use k8s_openapi::api::resource::v1::DeviceRequestAllocationResult;

use super::{acquire, plan, tenants};
use crate::claims::PrepareError;
use crate::claims::cdi::SpecDevice;
use crate::claims::checkpoint::{Checkpoint, RecordedDevice};
use crate::claims::kinds::{
    CdiPlace, Failed, GpuMode, GpuTxn, Holding, Kind, KindId, PlanCx, Planned, Precheck, gpu_edits,
    gpu_status, whole_gpus_against_inventory,
};
use crate::gpu::MigInstance;
use crate::publish::devices::{DeviceKind, DeviceRef};
use das_api::claim_status::DeviceStatusData;

/// The kind of a share of a whole GPU.
pub(crate) struct SharedWholeGpuKind;

#[tonic::async_trait]
impl Kind for SharedWholeGpuKind {
    fn id(&self) -> KindId {
        KindId::SharedWholeGpu
    }

    fn serves(&self, at: &DeviceRef) -> bool {
        at.kind == DeviceKind::WholeGpu && at.shared
    }

    fn recorded(&self, d: &RecordedDevice) -> bool {
        d.kind == DeviceKind::WholeGpu && d.share.is_some()
    }

    /// With its share ([`plan::share_of`]), of the `shares` this node publishes.
    fn plan(
        &self,
        r: DeviceRequestAllocationResult,
        at: DeviceRef,
        cx: &PlanCx,
    ) -> Result<Planned, PrepareError> {
        plan::planned_share(r, at, cx)
    }

    /// A share is served with MPS ([`plan::check_mps`]).
    fn check(&self, p: &Planned) -> Result<(), PrepareError> {
        plan::check_mps(std::slice::from_ref(p))
    }

    fn gpu_mode(&self) -> GpuMode {
        GpuMode::MigOff
    }

    fn shared_by_claims(&self) -> bool {
        true
    }

    /// The GPU's: named by its UUID (the device name says it is the GPU's shares), whichever
    /// share asks.
    fn owner<'a>(&self, _claim_uid: &'a str, d: &'a RecordedDevice) -> &'a str {
        &d.gpu_uuid
    }

    fn kept_by_others(&self, cp: &Checkpoint, uid: &str, d: &RecordedDevice) -> bool {
        plan::kept_by_other_shares(cp, uid, d)
    }

    fn creates_instance(&self) -> bool {
        false
    }

    fn serves_mps(&self) -> bool {
        true
    }

    /// The GPU's UUID: the daemon serves the whole GPU.
    fn mps_uuid<'a>(&self, d: &'a RecordedDevice) -> Option<&'a str> {
        Some(&d.gpu_uuid)
    }

    /// Its GPU against the inventory, as a whole GPU's; then its shares may not join a GPU
    /// claims of another namespace hold.
    async fn precheck(&self, planned: &[&Planned], cx: &Precheck<'_>) -> Result<(), PrepareError> {
        whole_gpus_against_inventory(planned, cx).await?;
        tenants::check_namespace(planned, cx)
    }

    /// Holds the GPU, as other shares of it do ([`acquire::hold_gpu`]): its device node, as
    /// published.
    async fn acquire(&self, i: usize, p: &Planned, tx: &GpuTxn<'_>) -> Result<Holding, Failed> {
        acquire::hold_gpu(i, p, tx)?;
        Ok(Holding::WholeGpu {
            minor: p.at.gpu_minor,
        })
    }

    /// Its GPU's device node while this node publishes its shares.
    fn holding(
        &self,
        _d: &RecordedDevice,
        _live: Option<&MigInstance>,
        minor: Option<u32>,
    ) -> Option<Holding> {
        minor.map(|minor| Holding::WholeGpu { minor })
    }

    fn cdi_edits(&self, d: &RecordedDevice, h: &Holding, at: CdiPlace<'_>, dev: &mut SpecDevice) {
        gpu_edits(d, h, at, dev);
    }

    /// None: every share of the GPU has its device node; only a share's CDI variables mark its
    /// containers.
    fn own_node(&self, _path: &str) -> bool {
        false
    }

    fn status(&self, d: &RecordedDevice, ready_time: Option<String>) -> (DeviceStatusData, String) {
        gpu_status(d, ready_time, "share of whole GPU")
    }

    /// A share of a whole GPU is never carved: it is published without binding conditions.
    fn carved_before_bind(&self) -> bool {
        false
    }
}
