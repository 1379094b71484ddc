//! Shares of a shareable device: of a MIG instance ([`SharedSliceKind`]) or of a whole GPU
//! ([`SharedWholeGpuKind`], in [`whole`]), which share the reference count of the records, the
//! tenancy rule and MPS.
//!
//! A share of a shareable MIG instance (docs/design.md §7, "Shared slices"): the device
//! `gpu-<i>-mig-<profile>-<start>-shared`, allocated to several claims, each with a share
//! (`shareID`, consumed `shares` and `memory`). The first share's prepare creates the MIG instance,
//! later ones join it, and the last one's release destroys it; the checkpoint's records are the
//! reference count ([`plan`]). Every share is served with MPS. A MIG instance serves one namespace
//! unless the admin lets shares cross namespaces ([`tenants`]).

use k8s_openapi::api::resource::v1::DeviceRequestAllocationResult;

use crate::claims::PrepareError;
use crate::claims::cdi::SpecDevice;
use crate::claims::checkpoint::{Checkpoint, RecordedDevice};
use crate::claims::kinds::{
    CdiPlace, Failed, GpuMode, GpuTxn, Holding, Kind, KindId, NodeDevices, PlanCx, Planned,
    Precheck, RecordFacts, instance_edits, instance_status, is_capability_node,
};
use crate::gpu::MigInstance;
use crate::publish::devices::{DeviceKind, DeviceRef};
use das_api::claim_status::DeviceStatusData;

mod acquire;
pub(crate) mod plan;
mod tenants;
mod whole;

pub(crate) use whole::SharedWholeGpuKind;

/// The shared slice kind.
pub(crate) struct SharedSliceKind;

#[tonic::async_trait]
impl Kind for SharedSliceKind {
    fn id(&self) -> KindId {
        KindId::SharedSlice
    }

    fn serves(&self, at: &DeviceRef) -> bool {
        at.kind == DeviceKind::Mig && at.shared
    }

    fn recorded(&self, d: &RecordedDevice) -> bool {
        d.share.is_some() && d.kind == DeviceKind::Mig
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
        GpuMode::MigOn
    }

    fn shared_by_claims(&self) -> bool {
        true
    }

    /// The MIG instance's: named by its GPU's UUID (the device name gives the placement), whichever
    /// share asks.
    fn owner<'a>(&self, _claim_uid: &'a str, d: &'a RecordedDevice) -> &'a str {
        &d.gpu_uuid
    }

    fn kept_by_others(&self, cp: &Checkpoint, uid: &str, d: &RecordedDevice) -> bool {
        plan::kept_by_other_shares(cp, uid, d)
    }

    fn record_facts(&self, node: &NodeDevices) -> Option<RecordFacts> {
        tenants::namespaces_facts(node)
    }

    fn creates_instance(&self) -> bool {
        true
    }

    /// Its shares may not join a MIG instance claims of another namespace hold.
    async fn precheck(&self, planned: &[&Planned], cx: &Precheck<'_>) -> Result<(), PrepareError> {
        tenants::check_namespace(planned, cx)
    }

    /// Creates the MIG instance, or joins the one other shares hold ([`plan::on_share`]).
    async fn acquire(&self, i: usize, p: &Planned, tx: &GpuTxn<'_>) -> Result<Holding, Failed> {
        acquire::create_or_join(i, p, tx)
            .await
            .map(Holding::Instance)
    }

    fn holding(
        &self,
        _d: &RecordedDevice,
        live: Option<&MigInstance>,
        _minor: Option<u32>,
    ) -> Option<Holding> {
        live.cloned().map(Holding::Instance)
    }

    fn cdi_edits(&self, _d: &RecordedDevice, h: &Holding, at: CdiPlace<'_>, dev: &mut SpecDevice) {
        if let Some(s) = h.instance() {
            dev.instances.push(instance_edits(s, at));
        }
    }

    /// Its GI's and CI's capability nodes (the parent node every MIG instance of the GPU shares).
    fn own_node(&self, path: &str) -> bool {
        is_capability_node(path)
    }

    fn status(&self, d: &RecordedDevice, ready_time: Option<String>) -> (DeviceStatusData, String) {
        instance_status(d, ready_time)
    }
}
