//! The monitor's Node events and log lines: one per health transition (GPU or GPU instance
//! unhealthy, recovered, a non-fatal XID) and per unclaimed MIG instance withdrawn or gone.
//! The notes name the GPU by index and UUID, the cause, the taints and how the condition ends,
//! so an operator reading `kubectl get events` knows what to do without the logs.

use super::HealthMonitor;
use crate::events::{EventKind, EventTarget};
use crate::gpu::MigInstance;
use crate::health::book::{GpuTaint, Transition};
use crate::health::xid;

impl HealthMonitor {
    /// Posts the Node event of an unclaimed instance that `appeared` (its devices withdrawn) or
    /// is gone (offered again), and logs it.
    pub(super) async fn report_unclaimed(&self, i: &MigInstance, appeared: bool) {
        let what = format!(
            "GPU {} ({}) MIG instance {} at memory slice {} ({})",
            i.gpu_index, i.gpu_uuid, i.profile, i.placement.start, i.mig_uuid
        );
        if appeared {
            tracing::warn!(gpu = i.gpu_index, profile = %i.profile, start = i.placement.start, mig = %i.mig_uuid,
                "a MIG instance no claim holds: the devices overlapping it are withdrawn until it is gone");
            self.events
                .warn(
                    &EventTarget::Node,
                    "UnclaimedMigInstance",
                    format!(
                        "{what} is held by no claim (created outside DAS, e.g. with nvidia-smi): the devices overlapping it are not offered until it is gone. Destroy it, or restart the plugin with --reclaim-foreign-slices."
                    ),
                )
                .await;
        } else {
            tracing::info!(gpu = i.gpu_index, start = i.placement.start, mig = %i.mig_uuid,
                "the unclaimed MIG instance is gone: its devices are offered again");
            self.events
                .event(
                    &EventTarget::Node,
                    EventKind::Normal,
                    "UnclaimedMigInstanceGone",
                    format!("{what} is gone: the devices overlapping it are offered again."),
                )
                .await;
        }
    }

    /// Logs `t`, posts its Node event and sets the GPU's health gauge.
    pub(super) async fn report(&self, t: &Transition) {
        // Any change of a GPU or of one of its GPU instances may change whether all its devices
        // are healthy; a non-fatal XID changes nothing (and may be about a GPU not managed here).
        if !matches!(t, Transition::NonFatalXid { .. }) {
            let healthy = self.book().healthy(t.gpu());
            self.metrics.set_gpu_healthy(t.gpu(), healthy);
        }
        match t {
            Transition::Unhealthy { gpu, cause } => {
                let taints = self.book().taints(*gpu);
                let (list, quiet) = self.taint_list(&taints);
                let note = format!(
                    "{}: {cause}. Its MIG devices are tainted {list} until it answers without a fatal error for {quiet} s.",
                    self.gpu_name(*gpu)
                );
                tracing::error!(gpu, %cause, taints = %list, "GPU unhealthy");
                self.warn_unhealthy(note).await;
            }
            Transition::InstanceUnhealthy {
                gpu,
                instance,
                cause,
            } => {
                let taints = self.book().instance_taints(*gpu, instance.placement);
                let (list, quiet) = self.taint_list(&taints);
                let note = format!(
                    "{}, {instance}: {cause}. The MIG devices overlapping its placement are tainted {list} until no fatal error comes from it for {quiet} s; the GPU's other devices stay in service.",
                    self.gpu_name(*gpu)
                );
                tracing::error!(gpu, gi = instance.id, placement = %instance.placement, %cause,
                    taints = %list, "GPU instance unhealthy");
                self.warn_unhealthy(note).await;
            }
            Transition::NonFatalXid { gpu, xid } => {
                tracing::warn!(gpu, xid, "non-fatal XID (an application error)");
                self.events
                    .warn(
                        &EventTarget::Node,
                        "GpuXid",
                        format!(
                            "{}: XID {xid} ({}), an application error: the GPU stays in service.",
                            self.gpu_name(*gpu),
                            xid::describe(*xid)
                        ),
                    )
                    .await;
            }
            Transition::Recovered { gpu } => {
                tracing::info!(gpu, "GPU healthy again; taints removed");
                let note = format!(
                    "{}: healthy again; the taints on its MIG devices are removed.",
                    self.gpu_name(*gpu)
                );
                self.report_recovered(note).await;
            }
            Transition::InstanceRecovered { gpu, instance } => {
                tracing::info!(gpu, gi = instance.id, placement = %instance.placement,
                    "GPU instance healthy again; taints removed");
                let note = format!(
                    "{}, {instance}: healthy again; the taints on the MIG devices overlapping it are removed.",
                    self.gpu_name(*gpu)
                );
                self.report_recovered(note).await;
            }
        }
    }

    /// `taints` as `key=value:effect, …`, and the quiet period in seconds, for events.
    fn taint_list(&self, taints: &[GpuTaint]) -> (String, u64) {
        let book = self.book();
        let effect = book.policy().effect;
        let list: Vec<String> = taints
            .iter()
            .map(|t| format!("{}={}:{}", t.key, t.value, effect.as_str()))
            .collect();
        (list.join(", "), book.policy().quiet_period.as_secs())
    }

    async fn warn_unhealthy(&self, note: String) {
        self.events
            .warn(&EventTarget::Node, "GpuUnhealthy", note)
            .await;
    }

    async fn report_recovered(&self, note: String) {
        self.events
            .event(&EventTarget::Node, EventKind::Normal, "GpuRecovered", note)
            .await;
    }

    /// `GPU <index> (<UUID>)`, for events.
    fn gpu_name(&self, gpu: u32) -> String {
        match self.uuids.get(&gpu) {
            Some(uuid) => format!("GPU {gpu} ({uuid})"),
            None => format!("GPU {gpu}"),
        }
    }
}
