//! MIG mode follows demand (docs/design.md §7, "MIG mode follows demand"): before a prepare
//! creates a GPU's first MIG instance the GPU's MIG mode must be on, before it serves the GPU
//! whole it must be off. [`Preparer::ensure_mig_mode`] switches it where [`plan::mig_mode`]
//! allows, under the GPU's lock, recording the switch in the checkpoint first; a failed switch
//! fails the prepare ([`PrepareError::MigModeSwitch`]), stops DAS switching that GPU until the
//! plugin restarts, posts a Warning event on the Node and has the publisher withdraw the devices
//! the GPU's mode does not serve ([`MigModes`]). Start-up recovers a switch the plugin stopped in
//! the middle of ([`Preparer::recover_mig_mode_switches`]).

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use tokio::sync::watch;

use super::Preparer;
use crate::claims::checkpoint::CheckpointError;
use crate::claims::plan::mig_mode::{self, GpuNow, ModeStep};
use crate::claims::{EventTarget, PrepareError};
use crate::gpu::{BackendError, GpuInfo, MigModeState, MigSwitch, on_off};
use crate::metrics::Metrics;
use crate::publish::desired::HealthFacts;
use crate::publish::devices::DeviceKind;

/// Whether DAS may switch each GPU's MIG mode, and where a GPU that may no longer is reported.
pub(crate) struct MigModes {
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
    /// Where [`Self::serves_only`] goes for publication (set by [`Preparer::report_mig_modes_to`]).
    facts: OnceLock<watch::Sender<HealthFacts>>,
}

impl MigModes {
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
    fn refuse(&self, gpu: u32, mig_enabled: bool, why: String, metrics: &Metrics) -> bool {
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
}

impl Preparer {
    /// Has the publisher learn of every GPU that stops switching (now and from then on) through
    /// `facts` ([`HealthFacts::serves_only`]). Call once, before publishing.
    pub fn report_mig_modes_to(&self, facts: watch::Sender<HealthFacts>) {
        if self.modes.facts.set(facts).is_ok() {
            self.modes.send();
        }
    }

    /// The GPUs that serve one kind of device only because a switch failed since start-up.
    pub fn serves_only(&self) -> BTreeMap<u32, DeviceKind> {
        lock(&self.modes.serves_only).clone()
    }

    /// Makes GPU `gpu`'s MIG mode `want_mig` for claim `uid`'s `device`, switching it where
    /// [`mig_mode::mode_step`] allows. The caller holds the GPU's lock.
    ///
    /// # Errors
    /// [`PrepareError::MigModeSwitch`]: the mode cannot be read, the switch is refused, or it
    /// failed (the GPU then keeps its mode and DAS stops switching it);
    /// [`PrepareError::Checkpoint`]: the switch could not be recorded (nothing was switched).
    pub(crate) async fn ensure_mig_mode(
        &self,
        uid: &str,
        gpu: u32,
        want_mig: bool,
        device: &str,
    ) -> Result<(), PrepareError> {
        let fail = |reason: String| PrepareError::MigModeSwitch {
            device: device.to_string(),
            gpu,
            mig_enabled: want_mig,
            reason,
        };
        // A GPU that does not answer fails as for any call on it (`gpu_unavailable`).
        let mode = self
            .gpus
            .call(gpu, move |b| b.mig_mode(gpu))
            .await
            .map_err(PrepareError::GpuUnavailable)?;
        if mode.current == want_mig {
            return Ok(());
        }
        let switch = self.modes.switch_of(gpu);
        let holders = self
            .records
            .checkpoint
            .read(|cp| mig_mode::holders_on_gpu(cp, uid, gpu, want_mig));
        let instances = if want_mig || !switch.allowed() {
            0
        } else {
            self.gpus
                .instances_on(gpu)
                .await
                .map_err(|e| {
                    fail(format!(
                        "its MIG instances cannot be listed ({e}); the kubelet retries"
                    ))
                })?
                .len()
        };
        let now = GpuNow {
            gpu,
            mode,
            switch: &switch,
            holders,
            instances,
        };
        match mig_mode::mode_step(want_mig, &now) {
            ModeStep::Ready => Ok(()),
            ModeStep::Refuse(reason) => Err(fail(reason)),
            ModeStep::Switch => self
                .switch_mig_mode(uid, gpu, mode, want_mig)
                .await
                .map_err(|e| match e {
                    Switched::Failed(reason) => fail(reason),
                    Switched::Checkpoint(e) => e,
                }),
        }
    }

    /// Records the switch (saved before the call), switches, forgets the record (saved with the
    /// prepare's next write). On a failure DAS stops switching the GPU ([`Self::switch_failed`]).
    async fn switch_mig_mode(
        &self,
        uid: &str,
        gpu: u32,
        mode: MigModeState,
        want_mig: bool,
    ) -> Result<(), Switched> {
        let uuid = self.modes.uuids.get(&gpu).cloned().unwrap_or_default();
        let recorded = self
            .records
            .checkpoint
            .commit(|cp| cp.set_mig_mode_switch(gpu, &uuid, want_mig, uid))
            .await;
        if let Err(e) = recorded {
            // Nothing was switched: the record must not reach the file with a later write.
            self.records
                .checkpoint
                .change(|cp| cp.clear_mig_mode_switch(gpu));
            return Err(Switched::Checkpoint(e.into()));
        }
        let t0 = Instant::now();
        let r = self
            .gpus
            .call(gpu, move |b| b.set_mig_mode(gpu, want_mig))
            .await;
        self.metrics.observe_backend("set_mig_mode", t0.elapsed());
        let result = match r {
            Ok(()) => {
                self.metrics.mig_mode_switched(want_mig, "ok");
                tracing::info!(
                    gpu,
                    to = on_off(want_mig),
                    claim = uid,
                    ms = t0.elapsed().as_millis() as u64,
                    "MIG mode switched"
                );
                Ok(())
            }
            Err(e) => {
                self.metrics.mig_mode_switched(want_mig, e.kind());
                Err(Switched::Failed(
                    self.switch_failed(gpu, mode, want_mig, &e).await,
                ))
            }
        };
        // Saved with the prepare's next write (its completion or its roll-back): a record left
        // on disk by a crash before that is one start-up finds switched and forgets, and a
        // failed write must not fail a prepare whose switch worked.
        self.records
            .checkpoint
            .change(|cp| cp.clear_mig_mode_switch(gpu));
        result
    }

    /// After a failed switch of GPU `gpu` to `want_mig`: reads the mode the GPU has now (a
    /// switch that took effect but failed a later check, such as a changed minor number, left
    /// it switched), sets a pending change back (a `RESET_REQUIRED` switch left one), stops
    /// switching the GPU, tells the publisher and the Node's events. Returns the prepare's
    /// reason.
    async fn switch_failed(
        &self,
        gpu: u32,
        mode: MigModeState,
        want_mig: bool,
        e: &BackendError,
    ) -> String {
        let (now, reverted) = self.settle_mode(gpu, mode.current).await;
        let (to, have) = (on_off(want_mig), on_off(now));
        tracing::error!(gpu, to, error = %e, reverted = %reverted, "switching MIG mode failed; DAS stops switching this GPU");
        let why = format!("a switch to MIG mode {to} failed: {e}");
        if self.modes.refuse(gpu, now, why, &self.metrics) {
            self.warn(
                EventTarget::Node,
                "MigModeSwitchFailed",
                format!(
                    "GPU {gpu} ({}): switching MIG mode {to} failed: {e}. {reverted}The GPU has MIG mode {have}; DAS no longer switches it (until the plugin restarts) and publishes only what MIG mode {have} serves.",
                    self.modes.uuids.get(&gpu).map_or("", String::as_str)
                ),
            )
            .await;
        }
        format!(
            "switching failed ({e}); the GPU has MIG mode {have}, DAS no longer switches it and publishes only what that mode serves, so delete the pod to have its claim allocated elsewhere"
        )
    }

    /// GPU `gpu`'s MIG mode now (`assumed` when it cannot be read), after setting back a change
    /// left pending a reset (so a later reset does not change the mode under DAS); with what it
    /// did, as a sentence for events (empty when nothing was pending).
    pub(crate) async fn settle_mode(&self, gpu: u32, assumed: bool) -> (bool, String) {
        let m = match self.gpus.call(gpu, move |b| b.mig_mode(gpu)).await {
            Ok(m) => m,
            Err(e) => return (assumed, format!("The mode could not be read again ({e}). ")),
        };
        if m.pending == m.current {
            return (m.current, String::new());
        }
        let current = m.current;
        let did = match self
            .gpus
            .call(gpu, move |b| b.set_mig_mode(gpu, current))
            .await
        {
            Ok(()) => "The pending change was set back. ".to_string(),
            Err(e) => format!(
                "Setting the pending change back failed ({e}): the next GPU reset switches MIG mode; run `nvidia-smi -i {gpu} -mig {}`. ",
                u8::from(current)
            ),
        };
        (current, did)
    }

    /// Start-up: finishes what the checkpoint says a stopped plugin was switching. A switch that
    /// took effect is kept; one left pending a reset is set back and the GPU no longer switched;
    /// one that never started is forgotten. Every record is removed. Called with no request in
    /// flight.
    ///
    /// # Errors
    /// The checkpoint could not be saved.
    pub(crate) async fn recover_mig_mode_switches(&self) -> Result<(), CheckpointError> {
        let switches = self
            .records
            .checkpoint
            .read(|cp| cp.mig_mode_switches.clone());
        for (gpu, s) in switches {
            let _held = self.gpus.lock(gpu).await;
            let to = on_off(s.mig_enabled);
            tracing::info!(gpu, to, claim = %s.claim, started_at = s.started_at,
                "finishing a MIG mode switch the checkpoint records as under way");
            let now = self.modes.uuids.get(&gpu);
            if now != Some(&s.gpu_uuid) {
                // The GPUs changed since (another board at this index): the switch was not of
                // this GPU, whose mode is as found.
                tracing::warn!(gpu, recorded = %s.gpu_uuid, now = ?now,
                    "the GPU at this index is not the one the switch was of; forgetting it");
            } else {
                self.recover_switch(gpu, s.mig_enabled).await;
            }
            self.records
                .checkpoint
                .commit(|cp| cp.clear_mig_mode_switch(gpu))
                .await?;
        }
        Ok(())
    }

    /// Finishes one interrupted switch of GPU `gpu` to `mig_enabled` (see
    /// [`Self::recover_mig_mode_switches`]). The caller holds the GPU's lock.
    async fn recover_switch(&self, gpu: u32, mig_enabled: bool) {
        let to = on_off(mig_enabled);
        match self.gpus.call(gpu, move |b| b.mig_mode(gpu)).await {
            Ok(m) if m.current == mig_enabled => {
                tracing::info!(
                    gpu,
                    to,
                    "a MIG mode switch interrupted by a restart took effect"
                );
            }
            Ok(m) if m.pending == mig_enabled => {
                let (_, reverted) = self.settle_mode(gpu, m.current).await;
                let why = format!(
                    "a switch to MIG mode {to} interrupted by a restart was left pending a reset"
                );
                tracing::warn!(gpu, to, %reverted, "{why}");
                self.modes.refuse(gpu, m.current, why, &self.metrics);
            }
            Ok(_) => {
                tracing::info!(
                    gpu,
                    to,
                    "a MIG mode switch interrupted by a restart never started"
                );
            }
            Err(e) => {
                let why = format!(
                    "its MIG mode cannot be read after a switch to {to} was interrupted ({e})"
                );
                tracing::warn!(gpu, "{why}");
                let on = self.modes.started_on.get(&gpu).copied().unwrap_or(true);
                self.modes.refuse(gpu, on, why, &self.metrics);
            }
        }
    }
}

/// Why [`Preparer::switch_mig_mode`] failed.
enum Switched {
    /// The switch failed; the prepare's reason.
    Failed(String),
    /// The checkpoint could not record it before the call (nothing was switched).
    Checkpoint(PrepareError),
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
