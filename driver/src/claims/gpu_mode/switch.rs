//! The switch of a GPU's MIG mode a prepare needs (docs/design.md §7, "MIG mode follows
//! demand"): under the GPU's lock, where [`super::decide`] allows, recorded in the checkpoint
//! first; a failure sets a pending change back and stops DAS switching that GPU.

use std::time::Instant;

use super::decide::{self, GpuNow, ModeStep};
use super::{GpuModes, ModeCalls};
use crate::claims::error::ModeRefusal;
use crate::claims::{EventTarget, PrepareError};
use crate::gpu::{BackendError, MigModeState, on_off};

impl GpuModes {
    /// Makes GPU `gpu`'s MIG mode `want_mig` for claim `uid`'s `device`, switching it where
    /// [`decide::mode_step`] allows. The caller holds the GPU's lock.
    ///
    /// # Errors
    /// [`PrepareError::MigModeSwitch`]: the mode cannot be read, the switch is refused, or it
    /// failed (the GPU then keeps its mode and DAS stops switching it);
    /// [`PrepareError::Checkpoint`]: the switch could not be recorded (nothing was switched).
    pub(crate) async fn ensure(
        &self,
        cx: &ModeCalls<'_>,
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
        let mode = cx
            .gpus
            .call(gpu, move |b| b.mig_mode(gpu))
            .await
            .map_err(PrepareError::GpuUnavailable)?;
        if mode.current == want_mig {
            return Ok(());
        }
        let switch = self.switch_of(gpu);
        let holders = cx
            .checkpoint
            .read(|cp| decide::holders_on_gpu(cp, uid, gpu, want_mig));
        let instances = if want_mig || !switch.allowed() {
            0
        } else {
            cx.gpus
                .instances_on(gpu)
                .await
                .map_err(|e| fail(ModeRefusal::Unlisted(e).to_string()))?
                .len()
        };
        let now = GpuNow {
            gpu,
            mode,
            switch: &switch,
            holders,
            instances,
        };
        match decide::mode_step(want_mig, &now) {
            ModeStep::Ready => Ok(()),
            ModeStep::Refuse(reason) => Err(fail(reason)),
            ModeStep::Switch => self
                .switch_mig_mode(cx, uid, gpu, mode, want_mig)
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
        cx: &ModeCalls<'_>,
        uid: &str,
        gpu: u32,
        mode: MigModeState,
        want_mig: bool,
    ) -> Result<(), Switched> {
        let uuid = self.uuids.get(&gpu).cloned().unwrap_or_default();
        let recorded = cx
            .checkpoint
            .commit(|cp| cp.set_mig_mode_switch(gpu, &uuid, want_mig, uid))
            .await;
        if let Err(e) = recorded {
            // Nothing was switched: the record must not reach the file with a later write.
            cx.checkpoint.change(|cp| cp.clear_mig_mode_switch(gpu));
            return Err(Switched::Checkpoint(e.into()));
        }
        let t0 = Instant::now();
        let r = cx
            .gpus
            .call(gpu, move |b| b.set_mig_mode(gpu, want_mig))
            .await;
        cx.metrics.observe_backend("set_mig_mode", t0.elapsed());
        let result = match r {
            Ok(()) => {
                cx.metrics.mig_mode_switched(want_mig, "ok");
                tracing::info!(
                    gpu,
                    to = on_off(want_mig),
                    // The span carries the claim too; the demo's report greps this field.
                    claim = uid,
                    ms = t0.elapsed().as_millis() as u64,
                    "MIG mode switched"
                );
                Ok(())
            }
            Err(e) => {
                cx.metrics.mig_mode_switched(want_mig, e.kind());
                Err(Switched::Failed(
                    self.switch_failed(cx, gpu, mode, want_mig, &e).await,
                ))
            }
        };
        // Saved with the prepare's next write (its completion or its roll-back): a record left
        // on disk by a crash before that is one start-up finds switched and forgets, and a
        // failed write must not fail a prepare whose switch worked.
        cx.checkpoint.change(|cp| cp.clear_mig_mode_switch(gpu));
        result
    }

    /// After a failed switch of GPU `gpu` to `want_mig`: reads the mode the GPU has now (a
    /// switch that took effect but failed a later check, such as a changed minor number, left
    /// it switched), sets a pending change back (a `RESET_REQUIRED` switch left one), stops
    /// switching the GPU, tells the publisher and the Node's events. Returns the prepare's
    /// reason.
    async fn switch_failed(
        &self,
        cx: &ModeCalls<'_>,
        gpu: u32,
        mode: MigModeState,
        want_mig: bool,
        e: &BackendError,
    ) -> String {
        let (now, reverted) = self.settle_mode(cx, gpu, mode.current).await;
        let (to, have) = (on_off(want_mig), on_off(now));
        tracing::error!(gpu, to, error = %e, reverted = %reverted, "switching MIG mode failed; DAS stops switching this GPU");
        let why = format!("a switch to MIG mode {to} failed: {e}");
        if self.refuse(gpu, now, why, cx.metrics) {
            cx.api.warn(
                &EventTarget::Node,
                "MigModeSwitchFailed",
                format!(
                    "GPU {gpu} ({}): switching MIG mode {to} failed: {e}. {reverted}The GPU has MIG mode {have}; DAS no longer switches it (until the plugin restarts) and publishes only what MIG mode {have} serves.",
                    self.uuids.get(&gpu).map_or("", String::as_str)
                ),
            )
            .await;
        }
        ModeRefusal::SwitchFailed {
            error: e.clone(),
            have,
        }
        .to_string()
    }

    /// GPU `gpu`'s MIG mode now (`assumed` when it cannot be read), after setting back a change
    /// left pending a reset (so a later reset does not change the mode under DAS); with what it
    /// did, as a sentence for events (empty when nothing was pending).
    pub(super) async fn settle_mode(
        &self,
        cx: &ModeCalls<'_>,
        gpu: u32,
        assumed: bool,
    ) -> (bool, String) {
        let m = match cx.gpus.call(gpu, move |b| b.mig_mode(gpu)).await {
            Ok(m) => m,
            Err(e) => return (assumed, format!("The mode could not be read again ({e}). ")),
        };
        if m.pending == m.current {
            return (m.current, String::new());
        }
        let current = m.current;
        let did = match cx
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
}

/// Why [`GpuModes::switch_mig_mode`] failed.
enum Switched {
    /// The switch failed; the prepare's reason.
    Failed(String),
    /// The checkpoint could not record it before the call (nothing was switched).
    Checkpoint(PrepareError),
}
