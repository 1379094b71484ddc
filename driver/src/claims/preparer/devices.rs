//! What the transaction asks of the device kinds ([`crate::claims::kinds`]) and of the GPUs'
//! MIG modes ([`crate::claims::gpu_mode`]): each kind's checks before anything is recorded for a
//! claim, what each recorded device holds, the MIG mode a GPU must take before its devices are
//! acquired, and what the publisher learns when a GPU stops switching.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::ResourceClaim;
use tokio::sync::watch;

use super::Preparer;
use crate::claims::PrepareError;
use crate::claims::checkpoint::{CheckpointError, RecordedDevice};
use crate::claims::gpu_mode::ModeCalls;
use crate::claims::handler::ClaimRef;
use crate::claims::kinds::{Holding, Precheck, RecordFacts};
use crate::claims::plan::{self, Planned};
use crate::gpu::MigInstance;
use crate::publish::desired::HealthFacts;
use crate::publish::devices::DeviceKind;

impl Preparer {
    /// Claim `claim`'s allocation (read as `rc`) resolved against what this node publishes
    /// ([`plan::resolve_allocation`]).
    ///
    /// # Errors
    /// As [`plan::resolve_allocation`].
    pub(crate) fn resolve(
        &self,
        claim: &ClaimRef,
        rc: Option<&ResourceClaim>,
    ) -> Result<Vec<Planned>, PrepareError> {
        plan::resolve_allocation(
            claim,
            rc,
            &self.node.name,
            &self.node.devices,
            self.node.shares_per_slice,
        )
    }

    /// Each kind's checks of claim `claim`'s planned devices of that kind, kinds in the
    /// registry's order ([`crate::claims::kinds::Kind::precheck`]): before anything is recorded
    /// and before the prepare waits for holders.
    ///
    /// # Errors
    /// The first kind's refusal; nothing was recorded.
    pub(crate) async fn check_kinds(
        &self,
        claim: &ClaimRef,
        planned: &[Planned],
    ) -> Result<(), PrepareError> {
        let switch_of = |gpu| self.modes.switch_of(gpu);
        let cx = Precheck {
            claim,
            node: &self.node,
            checkpoint: &self.records.checkpoint,
            gpus: &self.gpus,
            switch_of: &switch_of,
        };
        for kind in self.kinds.all() {
            let mine: Vec<&Planned> = planned
                .iter()
                .filter(|p| self.kinds.of(&p.at).id() == kind.id())
                .collect();
            if !mine.is_empty() {
                kind.precheck(&mine, &cx).await?;
            }
        }
        Ok(())
    }

    /// Has the publisher learn, through `facts`, what the kinds derive from the records (the
    /// namespace each shareable device serves, [`HealthFacts::share_namespaces`]), now and after
    /// every change of the records, whatever made it (a share recorded by a prepare or carve,
    /// the last share's record dropped by an unprepare, a roll-back, the reaper or the orphan
    /// rule). Nothing is reported where no kind derives anything (shares may cross
    /// namespaces). Call once, before publishing.
    pub fn report_share_namespaces_to(&self, facts: watch::Sender<HealthFacts>) {
        let parts: Vec<RecordFacts> = self
            .kinds
            .all()
            .filter_map(|k| k.record_facts(&self.node))
            .collect();
        if parts.is_empty() {
            return;
        }
        self.records.checkpoint.observe(move |cp| {
            // Every part updates its facts: no part is skipped because another changed.
            facts.send_if_modified(|f| {
                let mut changed = false;
                for part in &parts {
                    changed |= part(cp, f);
                }
                changed
            });
        });
    }

    /// The minor of the device node this node publishes for recorded device `d`: the device of
    /// its name, of its kind, on its GPU; `None` when it no longer publishes it so (the plugin
    /// restarted without `--whole-gpus`, or the GPU changed).
    fn published_minor(&self, d: &RecordedDevice) -> Option<u32> {
        let kind = self.kinds.of_record(d).id();
        self.node
            .devices
            .get(&d.device)
            .filter(|r| self.kinds.of(r).id() == kind && r.gpu_uuid == d.gpu_uuid)
            .map(|r| r.gpu_minor)
    }

    /// What each of `devices` holds ([`plan::holdings`]: each kind says), from the live
    /// instances matched to them and the device nodes this node publishes.
    pub(crate) fn holdings(
        &self,
        devices: &[RecordedDevice],
        matched: &[Option<MigInstance>],
    ) -> Vec<Option<Holding>> {
        plan::holdings(devices, matched, |d| self.published_minor(d))
    }

    /// The calls the MIG mode switches make.
    fn mode_calls(&self) -> ModeCalls<'_> {
        ModeCalls {
            gpus: &self.gpus,
            checkpoint: &self.records.checkpoint,
            metrics: &self.metrics,
            api: self.api.client.as_ref(),
        }
    }

    /// Makes GPU `gpu`'s MIG mode `want_mig` for claim `uid`'s `device`
    /// ([`crate::claims::gpu_mode::GpuModes::ensure`]). The caller holds the GPU's lock.
    ///
    /// # Errors
    /// [`PrepareError::MigModeSwitch`], [`PrepareError::GpuUnavailable`] or
    /// [`PrepareError::Checkpoint`], as that says.
    pub(crate) async fn ensure_mig_mode(
        &self,
        uid: &str,
        gpu: u32,
        want_mig: bool,
        device: &str,
    ) -> Result<(), PrepareError> {
        self.modes
            .ensure(&self.mode_calls(), uid, gpu, want_mig, device)
            .await
    }

    /// Start-up: finishes the MIG mode switches a stopped plugin left
    /// ([`crate::claims::gpu_mode::GpuModes::recover`]).
    ///
    /// # Errors
    /// The checkpoint could not be saved.
    pub(crate) async fn recover_mig_mode_switches(&self) -> Result<(), CheckpointError> {
        self.modes.recover(&self.mode_calls()).await
    }

    /// Has the publisher learn of every GPU that stops switching (now and from then on) through
    /// `facts` ([`HealthFacts::serves_only`]). Call once, before publishing.
    pub fn report_mig_modes_to(&self, facts: watch::Sender<HealthFacts>) {
        self.modes.report_to(facts);
    }

    /// The GPUs that serve one kind of device only because a switch failed since start-up.
    pub fn serves_only(&self) -> BTreeMap<u32, DeviceKind> {
        self.modes.serves_only()
    }
}
