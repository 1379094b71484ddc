//! Prometheus metrics of the node plugin (names prefixed `das_kubelet_plugin_`), served with
//! `/healthz` and `/readyz` by [`das_runtime::probes`]. The families, by group, are in
//! `metrics/families.rs`.

use std::sync::Arc;
use std::time::Duration;

use das_runtime::probes::Probe;
use prometheus_client::registry::Registry;

mod families;

use families::{
    CallLabels, CauseLabels, CheckLabels, Claims, DaemonLabels, ErrorLabels, GateLabels, GpuLabels,
    GpuProfileLabels, Gpus, MethodLabels, MigMode, Mps, Node, Requests, ResultLabels, SwitchLabels,
    XidLabels,
};

/// The plugin's metrics. Names are prefixed `das_kubelet_plugin_`.
pub struct Metrics {
    mps: Mps,
    mig_mode: MigMode,
    node: Node,
    requests: Requests,
    gpus: Gpus,
    claims: Claims,
    /// `/metrics` and `/readyz`: ready once the plugin serves the kubelet and has published its ResourceSlices.
    pub probe: Arc<Probe>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric under the `das_kubelet_plugin` prefix (docs/operations.md lists
    /// them), group by group.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("das_kubelet_plugin");
        let mps = Mps::register(&mut registry);
        let mig_mode = MigMode::register(&mut registry);
        let node = Node::register(&mut registry);
        let requests = Requests::register(&mut registry);
        let gpus = Gpus::register(&mut registry);
        let claims = Claims::register(&mut registry);
        Self {
            mps,
            mig_mode,
            node,
            requests,
            gpus,
            claims,
            probe: Arc::new(Probe::new(registry)),
        }
    }

    /// Records one prepare or unprepare of a claim; `cause` is the metric label of its failure
    /// (`PrepareError::metric_label`), if it failed.
    pub fn observe_call(&self, method: &str, cause: Option<&str>, took: Duration) {
        let result = if cause.is_none() { "success" } else { "error" };
        if let Some(cause) = cause {
            self.requests
                .errors
                .get_or_create(&ErrorLabels {
                    method: method.into(),
                    cause: cause.into(),
                })
                .inc();
        }
        self.requests
            .calls
            .get_or_create(&CallLabels {
                method: method.into(),
                result: result.into(),
            })
            .inc();
        self.requests
            .call_seconds
            .get_or_create(&MethodLabels {
                method: method.into(),
            })
            .observe(took.as_secs_f64());
    }

    /// Records one backend operation (`create`, `destroy`).
    pub fn observe_backend(&self, op: &str, took: Duration) {
        self.requests
            .backend_seconds
            .get_or_create(&MethodLabels { method: op.into() })
            .observe(took.as_secs_f64());
    }

    /// Sets the prepared-instance and memory-slice gauges of every GPU from
    /// `(gpu index, instances, memory slices)` (GPUs absent go to 0).
    pub fn set_prepared(&self, per_gpu: impl IntoIterator<Item = (u32, u64, u64)>) {
        self.gpus.prepared.clear();
        self.gpus.memory_slices_in_use.clear();
        for (gpu, instances, memory_slices) in per_gpu {
            let labels = GpuLabels {
                gpu: gpu.to_string(),
            };
            self.gpus
                .prepared
                .get_or_create(&labels)
                .set(instances as i64);
            self.gpus
                .memory_slices_in_use
                .get_or_create(&labels)
                .set(memory_slices as i64);
        }
    }

    /// Sets the free placements of GPU `gpu`: `(profile, placements)` for each of its profiles.
    pub fn set_free_placements(&self, gpu: u32, free: &[(String, u64)]) {
        for (profile, n) in free {
            self.gpus
                .free_placements
                .get_or_create(&GpuProfileLabels {
                    gpu: gpu.to_string(),
                    profile: profile.clone(),
                })
                .set(i64::try_from(*n).unwrap_or(i64::MAX));
        }
    }

    /// Sets whether GPU `gpu` is healthy.
    pub fn set_gpu_healthy(&self, gpu: u32, healthy: bool) {
        self.gpus
            .healthy
            .get_or_create(&GpuLabels {
                gpu: gpu.to_string(),
            })
            .set(i64::from(healthy));
    }

    /// Counts one MIG mode switch to `mig_enabled`, by `result` (`ok` or the backend error's
    /// kind).
    pub(crate) fn mig_mode_switched(&self, mig_enabled: bool, result: &str) {
        let to = crate::gpu::on_off(mig_enabled);
        self.mig_mode
            .switches
            .get_or_create(&SwitchLabels {
                to: to.into(),
                result: result.into(),
            })
            .inc();
    }

    /// Sets whether DAS may switch GPU `gpu`'s MIG mode.
    pub(crate) fn set_mig_mode_switchable(&self, gpu: u32, allowed: bool) {
        self.mig_mode
            .switchable
            .get_or_create(&GpuLabels {
                gpu: gpu.to_string(),
            })
            .set(i64::from(allowed));
    }

    /// Sets the number of supervised MPS control daemons.
    pub(crate) fn set_mps_daemons(&self, n: usize) {
        self.mps.daemons.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// One more (`true`) or one fewer (`false`) MPS control daemon runs.
    pub(crate) fn mps_daemon_up(&self, up: bool) {
        if up {
            self.mps.daemons_up.inc();
        } else {
            self.mps.daemons_up.dec();
        }
    }

    /// Counts one start of an MPS control daemon after it exited, by whether it worked.
    pub(crate) fn mps_daemon_restarted(&self, ok: bool) {
        let result = if ok { "ok" } else { "failure" };
        self.mps
            .restarts
            .get_or_create(&ResultLabels {
                result: result.into(),
            })
            .inc();
    }

    /// Sets the size and the bytes in use of daemon `daemon`'s shm directory.
    pub(crate) fn set_mps_shm(&self, daemon: &str, size: u64, used: u64) {
        let labels = DaemonLabels {
            daemon: daemon.to_string(),
        };
        let gauge = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        self.mps.shm_size.get_or_create(&labels).set(gauge(size));
        self.mps.shm_used.get_or_create(&labels).set(gauge(used));
    }

    /// Drops daemon `daemon`'s shm gauges (it is no longer supervised).
    pub(crate) fn forget_mps_shm(&self, daemon: &str) {
        let labels = DaemonLabels {
            daemon: daemon.to_string(),
        };
        self.mps.shm_size.remove(&labels);
        self.mps.shm_used.remove(&labels);
    }

    /// Counts one carve before bind of a claim's slices (`ok` or `failed`).
    pub(crate) fn carve_done(&self, ok: bool) {
        let result = if ok { "ok" } else { "failed" };
        self.claims
            .carves
            .get_or_create(&ResultLabels {
                result: result.into(),
            })
            .inc();
    }

    /// Sets the number of claims whose record guards their placements without instances.
    pub(crate) fn set_repairing(&self, n: i64) {
        self.claims.repairing.set(n);
    }

    /// Sets the number of slices carved before bind that no prepare has taken yet.
    pub(crate) fn set_carved(&self, n: i64) {
        self.claims.carved.set(n);
    }

    /// Counts one XID error on GPU `gpu`.
    pub fn xid_seen(&self, gpu: u32, xid: u32, fatal: bool) {
        self.gpus
            .xid_events
            .get_or_create(&XidLabels {
                gpu: gpu.to_string(),
                xid: xid.to_string(),
                fatal: fatal.to_string(),
            })
            .inc();
    }

    /// Counts one failed write of a claim's `status.devices`.
    pub fn status_write_failed(&self) {
        self.claims.status_write_failures.inc();
    }

    /// Counts one instance that could not be destroyed; `cause` is the backend error's kind.
    pub fn destroy_failed(&self, cause: &str) {
        self.requests
            .destroy_failures
            .get_or_create(&CauseLabels {
                cause: cause.into(),
            })
            .inc();
    }

    /// Counts one reaper attempt.
    pub fn reaper_attempt(&self, ok: bool) {
        let result = if ok { "success" } else { "failure" };
        self.requests
            .reaper_attempts
            .get_or_create(&ResultLabels {
                result: result.into(),
            })
            .inc();
    }

    /// Counts one release of an orphaned claim (the orphan rule), by whether every slice went.
    pub(crate) fn orphan_released(&self, ok: bool) {
        let result = if ok { "success" } else { "failure" };
        self.requests
            .orphan_releases
            .get_or_create(&ResultLabels {
                result: result.into(),
            })
            .inc();
    }

    /// Records how a prepare's wait for another claim's slices at its placements ended.
    pub fn placement_wait(&self, result: &str, took: Duration) {
        self.requests
            .placement_waits
            .get_or_create(&ResultLabels {
                result: result.into(),
            })
            .observe(took.as_secs_f64());
    }

    /// Sets the number of instances waiting for the reaper.
    pub fn set_pending_destroy(&self, n: i64) {
        self.requests.pending_destroy.set(n);
    }

    /// Sets whether the start-up check `check` (`node_checks::Check::label`) found a problem.
    pub(crate) fn set_node_setup_warning(&self, check: &str, found: bool) {
        self.node
            .setup_warning
            .get_or_create(&CheckLabels {
                check: check.into(),
            })
            .set(i64::from(found));
    }

    /// Sets whether the API server drops the ResourceSlice fields of feature gate `gate`.
    pub(crate) fn set_feature_gate_off(&self, gate: &str, off: bool) {
        self.node
            .feature_gate_off
            .get_or_create(&GateLabels { gate: gate.into() })
            .set(i64::from(off));
    }
}

#[cfg(test)]
mod tests;
