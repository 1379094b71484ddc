//! The MIG slice one claim holds (docs/design.md §7, "Prepare"): preparing it creates a MIG
//! instance at exactly its allocated placement ([`acquire`]), its CDI device gives that
//! instance's device nodes and MIG UUID ([`cdi`]), its release destroys exactly the recorded
//! instance (the transaction's, which destroys every kind's recorded instances alike). It is
//! the base kind: a MIG device no other kind serves is one.

use crate::claims::cdi::SpecDevice;
use crate::claims::checkpoint::RecordedDevice;
use crate::claims::kinds::{CdiPlace, Failed, GpuMode, GpuTxn, Holding, Kind, KindId, Planned};
use crate::gpu::MigInstance;
use crate::publish::devices::{DeviceKind, DeviceRef};

mod acquire;
mod cdi;

/// The MIG slice kind.
pub struct MigInstanceKind;

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

    async fn acquire(&self, p: &Planned, tx: &GpuTxn<'_>) -> Result<Holding, Failed> {
        acquire::create(p, tx).await.map(Holding::Instance)
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
            dev.instances.push(cdi::prepared_instance(s, at));
        }
    }
}
