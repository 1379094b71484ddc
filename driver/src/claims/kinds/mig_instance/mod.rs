//! The MIG instance one claim holds (docs/design.md §7, "Prepare"): preparing it creates a MIG
//! instance at exactly its allocated placement, its CDI device gives that instance's device
//! nodes and MIG UUID, its release destroys exactly the recorded instance. It is the base kind:
//! a MIG device no other kind serves is one. What it does with MIG instances (create, identity,
//! CDI edits, destroy) is what the shared slice does too, so it is the vocabulary of
//! [`crate::claims::kinds`] ([`GpuTxn::create_instance`], [`instance_edits`]) and the
//! transaction's (the destroy of every recorded instance).

use crate::claims::cdi::SpecDevice;
use crate::claims::checkpoint::RecordedDevice;
use crate::claims::kinds::{
    CdiPlace, Failed, GpuMode, GpuTxn, Holding, Kind, KindId, Planned, instance_edits,
    instance_status, is_capability_node,
};
use crate::gpu::MigInstance;
use crate::publish::devices::{DeviceKind, DeviceRef};
use das_api::claim_status::DeviceStatusData;

/// The MIG instance kind.
pub(crate) struct MigInstanceKind;

#[tonic::async_trait]
impl Kind for MigInstanceKind {
    fn id(&self) -> KindId {
        KindId::MigInstance
    }

    fn serves(&self, at: &DeviceRef) -> bool {
        at.kind == DeviceKind::Mig
    }

    fn recorded(&self, d: &RecordedDevice) -> bool {
        d.kind == DeviceKind::Mig
    }

    fn gpu_mode(&self) -> GpuMode {
        GpuMode::MigOn
    }

    fn creates_instance(&self) -> bool {
        true
    }

    async fn acquire(&self, _i: usize, p: &Planned, tx: &GpuTxn<'_>) -> Result<Holding, Failed> {
        tx.create_instance(p).await.map(Holding::Instance)
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
