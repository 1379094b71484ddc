//! MIG mode follows demand (docs/design.md §7, "MIG mode follows demand"): before a prepare
//! creates a GPU's first MIG instance the GPU's MIG mode must be on, before it serves the GPU
//! whole it must be off; each device's kind says which ([`crate::claims::kinds::Kind::gpu_mode`]).
//!
//! - [`decide`]: whether a prepare must switch, may, or must refuse (pure).
//! - [`switch`]: the switch under the GPU's lock ([`GpuModes::ensure`]), recorded in the
//!   checkpoint first; a failed switch fails the prepare ([`PrepareError::MigModeSwitch`]),
//!   stops DAS switching that GPU until the plugin restarts, posts a Warning event on the Node
//!   and has the publisher withdraw the devices the GPU's mode does not serve.
//! - [`recover`]: start-up finishes a switch the plugin stopped in the middle of
//!   ([`GpuModes::recover`]).
//!
//! [`GpuModes`] keeps, per GPU, whether DAS may switch it; the request path
//! ([`crate::claims::preparer`]) holds one and hands it the calls it makes ([`ModeCalls`]).

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};

use tokio::sync::watch;

use crate::claims::ClaimApi;
use crate::claims::checkpoint::CheckpointStore;
use crate::gpu::{GpuCalls, GpuInfo, MigSwitch};
use crate::metrics::Metrics;
use crate::publish::desired::HealthFacts;
use crate::publish::devices::DeviceKind;

pub(crate) mod decide;
mod recover;
mod switch;

#[cfg(doc)]
use crate::claims::PrepareError;

/// What the switches and their recovery call: the GPUs (one lock each), the checkpoint (a
/// switch is recorded before it is made), the metrics and the API server (the Node's events).
pub(crate) struct ModeCalls<'a> {
    /// The GPU calls.
    pub(crate) gpus: &'a GpuCalls,
    /// The checkpoint.
    pub(crate) checkpoint: &'a CheckpointStore,
    /// Metrics.
    pub(crate) metrics: &'a Metrics,
    /// Where Warning events go.
    pub(crate) api: &'a dyn ClaimApi,
}

/// Whether DAS may switch each GPU's MIG mode, and where a GPU that may no longer is reported.
pub(crate) struct GpuModes {
    /// By GPU index: the backend's answer at start-up, [`MigSwitch::Refused`] after a failed
    /// switch.
    switch: Mutex<BTreeMap<u32, MigSwitch>>,
    /// GPU UUIDs by index, for the checkpoint's switch records.
    uuids: BTreeMap<u32, String>,
    /// Whether MIG mode was on at start-up, by GPU index (the mode a GPU is taken to keep when
    /// it cannot be read).
    started_on: BTreeMap<u32, bool>,
    /// The GPUs refused since start-up, with the kind of device their mode serves.
    serves_only: Mutex<BTreeMap<u32, DeviceKind>>,
    /// Where [`Self::serves_only`] goes for publication (set by [`GpuModes::report_to`]).
    facts: OnceLock<watch::Sender<HealthFacts>>,
}

impl GpuModes {
    /// The switching of `inventory`'s GPUs as their backend reports it.
    pub(crate) fn new(inventory: &[GpuInfo], metrics: &Metrics) -> Self {
        for g in inventory {
            metrics.set_mig_mode_switchable(g.index, g.mig_switch.allowed());
        }
        Self {
            switch: Mutex::new(
                inventory
                    .iter()
                    .map(|g| (g.index, g.mig_switch.clone()))
                    .collect(),
            ),
            uuids: inventory
                .iter()
                .map(|g| (g.index, g.uuid.clone()))
                .collect(),
            started_on: inventory.iter().map(|g| (g.index, g.mig_enabled)).collect(),
            serves_only: Mutex::default(),
            facts: OnceLock::new(),
        }
    }

    /// Whether DAS may switch GPU `gpu` now.
    pub(crate) fn switch_of(&self, gpu: u32) -> MigSwitch {
        lock(&self.switch)
            .get(&gpu)
            .cloned()
            .unwrap_or_else(|| MigSwitch::Refused("the GPU is not in the inventory".into()))
    }

    /// Stops switching GPU `gpu` (`why`); it serves only what MIG mode `mig_enabled` serves
    /// from now on (reported to the publisher). Returns whether that changed anything.
    pub(crate) fn refuse(
        &self,
        gpu: u32,
        mig_enabled: bool,
        why: String,
        metrics: &Metrics,
    ) -> bool {
        let was = lock(&self.switch).insert(gpu, MigSwitch::Refused(why));
        metrics.set_mig_mode_switchable(gpu, false);
        if !was.is_some_and(|s| s.allowed()) {
            return false;
        }
        let kind = if mig_enabled {
            DeviceKind::Mig
        } else {
            DeviceKind::WholeGpu
        };
        lock(&self.serves_only).insert(gpu, kind);
        self.send();
        true
    }

    /// Sends the GPUs that serve one kind only to the publisher, if one listens.
    fn send(&self) {
        if let Some(tx) = self.facts.get() {
            let only = lock(&self.serves_only).clone();
            tx.send_modify(|f| f.serves_only = only);
        }
    }

    /// Has the publisher learn of every GPU that stops switching (now and from then on) through
    /// `facts` ([`HealthFacts::serves_only`]). Call once, before publishing.
    pub(crate) fn report_to(&self, facts: watch::Sender<HealthFacts>) {
        if self.facts.set(facts).is_ok() {
            self.send();
        }
    }

    /// The GPUs that serve one kind of device only because a switch failed since start-up.
    pub(crate) fn serves_only(&self) -> BTreeMap<u32, DeviceKind> {
        lock(&self.serves_only).clone()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
