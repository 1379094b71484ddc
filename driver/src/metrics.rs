//! Prometheus metrics of the node plugin (names prefixed `das_kubelet_plugin_`), served with
//! `/healthz` and `/readyz` by [`das_runtime::probes`].

use std::sync::Arc;
use std::time::Duration;

use das_runtime::probes::Probe;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    method: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabels {
    method: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    method: String,
    cause: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CauseLabels {
    cause: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GateLabels {
    gate: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CheckLabels {
    check: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SwitchLabels {
    to: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DaemonLabels {
    daemon: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GpuLabels {
    gpu: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GpuProfileLabels {
    gpu: String,
    profile: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct XidLabels {
    gpu: String,
    xid: String,
    fatal: String,
}

/// Buckets for latencies in seconds: 1 ms to ~16 s.
fn latency_histogram() -> Histogram {
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.001, 2.0, 15,
    ))
}

/// The plugin's metrics. Names are prefixed `das_kubelet_plugin_`.
pub struct Metrics {
    calls: Family<CallLabels, Counter>,
    call_seconds: Family<MethodLabels, Histogram, fn() -> Histogram>,
    backend_seconds: Family<MethodLabels, Histogram, fn() -> Histogram>,
    prepared: Family<GpuLabels, Gauge>,
    memory_slices_in_use: Family<GpuLabels, Gauge>,
    gpu_healthy: Family<GpuLabels, Gauge>,
    free_placements: Family<GpuProfileLabels, Gauge>,
    xid_events: Family<XidLabels, Counter>,
    status_write_failures: Counter,
    errors: Family<ErrorLabels, Counter>,
    destroy_failures: Family<CauseLabels, Counter>,
    reaper_attempts: Family<ResultLabels, Counter>,
    orphan_releases: Family<ResultLabels, Counter>,
    pending_destroy: Gauge,
    placement_waits: Family<ResultLabels, Histogram, fn() -> Histogram>,
    feature_gate_off: Family<GateLabels, Gauge>,
    node_setup_warning: Family<CheckLabels, Gauge>,
    mig_mode_switches: Family<SwitchLabels, Counter>,
    mig_mode_switchable: Family<GpuLabels, Gauge>,
    mps_daemons: Gauge,
    mps_daemons_up: Gauge,
    mps_daemon_restarts: Family<ResultLabels, Counter>,
    mps_shm_size: Family<DaemonLabels, Gauge>,
    mps_shm_used: Family<DaemonLabels, Gauge>,
    carves: Family<ResultLabels, Counter>,
    carved: Gauge,
    repairing: Gauge,
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
    /// them).
    // Over the 80 lines of clippy.toml: issue 42's package 8 splits it (remove this then).
    #[allow(clippy::too_many_lines)]
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("das_kubelet_plugin");
        let calls = Family::<CallLabels, Counter>::default();
        let call_seconds =
            Family::<MethodLabels, Histogram, fn() -> Histogram>::new_with_constructor(
                latency_histogram,
            );
        let backend_seconds =
            Family::<MethodLabels, Histogram, fn() -> Histogram>::new_with_constructor(
                latency_histogram,
            );
        let prepared = Family::<GpuLabels, Gauge>::default();
        let memory_slices_in_use = Family::<GpuLabels, Gauge>::default();
        let gpu_healthy = Family::<GpuLabels, Gauge>::default();
        let free_placements = Family::<GpuProfileLabels, Gauge>::default();
        let xid_events = Family::<XidLabels, Counter>::default();
        let status_write_failures = Counter::default();
        let errors = Family::<ErrorLabels, Counter>::default();
        let destroy_failures = Family::<CauseLabels, Counter>::default();
        let reaper_attempts = Family::<ResultLabels, Counter>::default();
        let orphan_releases = Family::<ResultLabels, Counter>::default();
        let pending_destroy = Gauge::default();
        let feature_gate_off = Family::<GateLabels, Gauge>::default();
        let node_setup_warning = Family::<CheckLabels, Gauge>::default();
        let mig_mode_switches = Family::<SwitchLabels, Counter>::default();
        let mig_mode_switchable = Family::<GpuLabels, Gauge>::default();
        let mps_daemons = Gauge::default();
        let mps_daemons_up = Gauge::default();
        let mps_daemon_restarts = Family::<ResultLabels, Counter>::default();
        let mps_shm_size = Family::<DaemonLabels, Gauge>::default();
        let mps_shm_used = Family::<DaemonLabels, Gauge>::default();
        registry.register(
            "mps_daemons",
            "MPS control daemons the plugin supervises, one per prepared MPS slice (docs/design.md, \"MPS on a slice\"): running, or being started again after an exit",
            mps_daemons.clone(),
        );
        registry.register(
            "mps_daemons_up",
            "MPS control daemons that run now (of das_kubelet_plugin_mps_daemons: those not waiting to be started again after an exit); fewer than supervised means a slice's MPS clients cannot connect",
            mps_daemons_up.clone(),
        );
        registry.register(
            "mps_daemon_restarts",
            "Starts of an MPS control daemon after it exited (with its limits applied again), by result: ok, or failure (retried with backoff up to 30 s)",
            mps_daemon_restarts.clone(),
        );
        registry.register(
            "mps_shm_size_bytes",
            "Size of each supervised MPS daemon's shm tmpfs (the /dev/shm of its slice's containers, --mps-shm-size), by daemon id (docs/design.md, \"MPS on a slice\"); a plain directory (--mps-shm-size=0) reports its file system's size",
            mps_shm_size.clone(),
        );
        registry.register(
            "mps_shm_used_bytes",
            "Bytes in use in each supervised MPS daemon's shm tmpfs, by daemon id (charged to the memory cgroups of the processes that wrote them); a client that reaches the size gets ENOSPC",
            mps_shm_used.clone(),
        );
        registry.register(
            "mig_mode_switches",
            "MIG mode switches a prepare made (docs/design.md, \"MIG mode follows demand\"), by the mode switched to (on, off) and result: ok, or the backend error's kind (reset_required, in_use, …; the GPU then keeps its mode and serves only what it serves)",
            mig_mode_switches.clone(),
        );
        registry.register(
            "gpu_mig_mode_switchable",
            "1 while DAS may switch the GPU's MIG mode to follow demand (--mig-mode-switching, Hopper or newer, no failed switch since the plugin started), 0 otherwise; per GPU index",
            mig_mode_switchable.clone(),
        );
        registry.register(
            "node_setup_warning",
            "1 when the start-up check found a problem in the node set-up DAS relies on, 0 when it passed (real GPUs; checked at each start): visible_devices_envvar (the NVIDIA container toolkit lets unprivileged pods ask for every GPU with NVIDIA_VISIBLE_DEVICES, or its config cannot be read), nvidia_uvm (/dev/nvidia-uvm or /dev/nvidia-uvm-tools missing: pods with DAS claims cannot start)",
            node_setup_warning.clone(),
        );
        registry.register(
            "apiserver_feature_gate_off",
            "1 while the API server drops the ResourceSlice fields of this feature gate: DRAPartitionableDevices (shared counters; the node's MIG devices are withdrawn until it keeps them), DRADeviceTaints (unhealthy GPUs' devices stay offered untainted), DRAConsumableCapacity (the shareable devices are withdrawn until the plugin restarts); 0 once it keeps them",
            feature_gate_off.clone(),
        );
        let placement_waits =
            Family::<ResultLabels, Histogram, fn() -> Histogram>::new_with_constructor(
                latency_histogram,
            );
        registry.register(
            "placement_wait_seconds",
            "Prepares that waited for another claim's slices at their placements (a force-deleted pod's claim not yet unprepared), by how the wait ended: released (by the kubelet's unprepare), timeout (the prepare failed with placement_held; the kubelet retries it)",
            placement_waits.clone(),
        );
        registry.register(
            "request_errors",
            "Failed prepares and unprepares per claim, by cause (PrepareError)",
            errors.clone(),
        );
        registry.register(
            "slice_destroy_failures",
            "Slices that could not be destroyed (they stay recorded and are retried), by backend error",
            destroy_failures.clone(),
        );
        registry.register(
            "reaper_attempts",
            "Retries of slice destroys left by an unprepare or a roll-back, by result",
            reaper_attempts.clone(),
        );
        registry.register(
            "orphan_releases",
            "Prepared claims the kubelet never unprepared, released by the orphan rule once the container runtime had no sandbox or container of their pods, by result (failure: slices left for the reaper)",
            orphan_releases.clone(),
        );
        registry.register(
            "slices_pending_destroy",
            "Slices of released claims that still exist and are retried by the reaper",
            pending_destroy.clone(),
        );
        registry.register(
            "requests",
            "NodePrepareResources/NodeUnprepareResources per claim, by result",
            calls.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "Time to prepare or unprepare one claim",
            call_seconds.clone(),
        );
        registry.register(
            "backend_duration_seconds",
            "Time of GPU backend operations (create, destroy, set_mig_mode)",
            backend_seconds.clone(),
        );
        registry.register(
            "prepared_slices",
            "MIG instances prepared for claims, per GPU index",
            prepared.clone(),
        );
        registry.register(
            "gpu_memory_slices_in_use",
            "Memory slices covered by the placements of prepared MIG instances, per GPU index",
            memory_slices_in_use.clone(),
        );
        registry.register(
            "gpu_healthy",
            "1 while the GPU is healthy, 0 while it is lost or after a fatal XID or ECC error (its devices carry taints), per GPU index",
            gpu_healthy.clone(),
        );
        registry.register(
            "free_placements",
            "Placements of a profile where a new MIG instance could be created now, per GPU index and profile (0 on every GPU: a pod asking for that profile waits)",
            free_placements.clone(),
        );
        registry.register(
            "xid_events",
            "XID errors the GPUs reported, by GPU index, XID and whether the health policy treats it as fatal",
            xid_events.clone(),
        );
        let carves = Family::<ResultLabels, Counter>::default();
        registry.register(
            "carves",
            "Carves before bind of a claim's slices (issue 34), by result (ok, failed)",
            carves.clone(),
        );
        let carved = Gauge::default();
        registry.register(
            "carved_slices",
            "Slices carved before bind that no prepare has taken yet",
            carved.clone(),
        );
        let repairing = Gauge::default();
        registry.register(
            "repairing_claims",
            "Claims the kubelet holds as prepared whose instances are gone (a repair that did not finish): their records keep holding their placements until the kubelet unprepares them (docs/design.md, \"A slice leaves its claim\")",
            repairing.clone(),
        );
        registry.register(
            "claim_status_write_failures",
            "Failed writes of a claim's status.devices",
            status_write_failures.clone(),
        );
        Self {
            probe: Arc::new(Probe::new(registry)),
            calls,
            call_seconds,
            backend_seconds,
            prepared,
            memory_slices_in_use,
            gpu_healthy,
            free_placements,
            xid_events,
            status_write_failures,
            errors,
            destroy_failures,
            reaper_attempts,
            orphan_releases,
            pending_destroy,
            placement_waits,
            feature_gate_off,
            node_setup_warning,
            mig_mode_switches,
            mig_mode_switchable,
            mps_daemons,
            mps_daemons_up,
            mps_daemon_restarts,
            mps_shm_size,
            mps_shm_used,
            carves,
            carved,
            repairing,
        }
    }

    /// Records one prepare or unprepare of a claim; `cause` is the metric label of its failure
    /// (`PrepareError::metric_label`), if it failed.
    pub fn observe_call(&self, method: &str, cause: Option<&str>, took: Duration) {
        let result = if cause.is_none() { "success" } else { "error" };
        if let Some(cause) = cause {
            self.errors
                .get_or_create(&ErrorLabels {
                    method: method.into(),
                    cause: cause.into(),
                })
                .inc();
        }
        self.calls
            .get_or_create(&CallLabels {
                method: method.into(),
                result: result.into(),
            })
            .inc();
        self.call_seconds
            .get_or_create(&MethodLabels {
                method: method.into(),
            })
            .observe(took.as_secs_f64());
    }

    /// Records one backend operation (`create`, `destroy`).
    pub fn observe_backend(&self, op: &str, took: Duration) {
        self.backend_seconds
            .get_or_create(&MethodLabels { method: op.into() })
            .observe(took.as_secs_f64());
    }

    /// Sets the prepared-instance and memory-slice gauges of every GPU from
    /// `(gpu index, instances, memory slices)` (GPUs absent go to 0).
    pub fn set_prepared(&self, per_gpu: impl IntoIterator<Item = (u32, u64, u64)>) {
        self.prepared.clear();
        self.memory_slices_in_use.clear();
        for (gpu, instances, memory_slices) in per_gpu {
            let labels = GpuLabels {
                gpu: gpu.to_string(),
            };
            self.prepared.get_or_create(&labels).set(instances as i64);
            self.memory_slices_in_use
                .get_or_create(&labels)
                .set(memory_slices as i64);
        }
    }

    /// Sets the free placements of GPU `gpu`: `(profile, placements)` for each of its profiles.
    pub fn set_free_placements(&self, gpu: u32, free: &[(String, u64)]) {
        for (profile, n) in free {
            self.free_placements
                .get_or_create(&GpuProfileLabels {
                    gpu: gpu.to_string(),
                    profile: profile.clone(),
                })
                .set(i64::try_from(*n).unwrap_or(i64::MAX));
        }
    }

    /// Sets whether GPU `gpu` is healthy.
    pub fn set_gpu_healthy(&self, gpu: u32, healthy: bool) {
        self.gpu_healthy
            .get_or_create(&GpuLabels {
                gpu: gpu.to_string(),
            })
            .set(i64::from(healthy));
    }

    /// Counts one MIG mode switch to `mig_enabled`, by `result` (`ok` or the backend error's
    /// kind).
    pub fn mig_mode_switched(&self, mig_enabled: bool, result: &str) {
        let to = crate::gpu::on_off(mig_enabled);
        self.mig_mode_switches
            .get_or_create(&SwitchLabels {
                to: to.into(),
                result: result.into(),
            })
            .inc();
    }

    /// Sets whether DAS may switch GPU `gpu`'s MIG mode.
    pub fn set_mig_mode_switchable(&self, gpu: u32, allowed: bool) {
        self.mig_mode_switchable
            .get_or_create(&GpuLabels {
                gpu: gpu.to_string(),
            })
            .set(i64::from(allowed));
    }

    /// Sets the number of supervised MPS control daemons.
    pub fn set_mps_daemons(&self, n: usize) {
        self.mps_daemons.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// One more (`true`) or one fewer (`false`) MPS control daemon runs.
    pub fn mps_daemon_up(&self, up: bool) {
        if up {
            self.mps_daemons_up.inc();
        } else {
            self.mps_daemons_up.dec();
        }
    }

    /// Counts one start of an MPS control daemon after it exited, by whether it worked.
    pub fn mps_daemon_restarted(&self, ok: bool) {
        let result = if ok { "ok" } else { "failure" };
        self.mps_daemon_restarts
            .get_or_create(&ResultLabels {
                result: result.into(),
            })
            .inc();
    }

    /// Sets the size and the bytes in use of daemon `daemon`'s shm directory.
    pub fn set_mps_shm(&self, daemon: &str, size: u64, used: u64) {
        let labels = DaemonLabels {
            daemon: daemon.to_string(),
        };
        let gauge = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        self.mps_shm_size.get_or_create(&labels).set(gauge(size));
        self.mps_shm_used.get_or_create(&labels).set(gauge(used));
    }

    /// Drops daemon `daemon`'s shm gauges (it is no longer supervised).
    pub fn forget_mps_shm(&self, daemon: &str) {
        let labels = DaemonLabels {
            daemon: daemon.to_string(),
        };
        self.mps_shm_size.remove(&labels);
        self.mps_shm_used.remove(&labels);
    }

    /// Counts one carve before bind of a claim's slices (`ok` or `failed`).
    pub fn carve_done(&self, ok: bool) {
        let result = if ok { "ok" } else { "failed" };
        self.carves
            .get_or_create(&ResultLabels {
                result: result.into(),
            })
            .inc();
    }

    /// Sets the number of claims whose record guards their placements without instances.
    pub fn set_repairing(&self, n: i64) {
        self.repairing.set(n);
    }

    /// Sets the number of slices carved before bind that no prepare has taken yet.
    pub fn set_carved(&self, n: i64) {
        self.carved.set(n);
    }

    /// Counts one XID error on GPU `gpu`.
    pub fn xid_seen(&self, gpu: u32, xid: u32, fatal: bool) {
        self.xid_events
            .get_or_create(&XidLabels {
                gpu: gpu.to_string(),
                xid: xid.to_string(),
                fatal: fatal.to_string(),
            })
            .inc();
    }

    /// Counts one failed write of a claim's `status.devices`.
    pub fn status_write_failed(&self) {
        self.status_write_failures.inc();
    }

    /// Counts one instance that could not be destroyed; `cause` is the backend error's kind.
    pub fn destroy_failed(&self, cause: &str) {
        self.destroy_failures
            .get_or_create(&CauseLabels {
                cause: cause.into(),
            })
            .inc();
    }

    /// Counts one reaper attempt.
    pub fn reaper_attempt(&self, ok: bool) {
        let result = if ok { "success" } else { "failure" };
        self.reaper_attempts
            .get_or_create(&ResultLabels {
                result: result.into(),
            })
            .inc();
    }

    /// Counts one release of an orphaned claim (the orphan rule), by whether every slice went.
    pub fn orphan_released(&self, ok: bool) {
        let result = if ok { "success" } else { "failure" };
        self.orphan_releases
            .get_or_create(&ResultLabels {
                result: result.into(),
            })
            .inc();
    }

    /// Records how a prepare's wait for another claim's slices at its placements ended.
    pub fn placement_wait(&self, result: &str, took: Duration) {
        self.placement_waits
            .get_or_create(&ResultLabels {
                result: result.into(),
            })
            .observe(took.as_secs_f64());
    }

    /// Sets the number of instances waiting for the reaper.
    pub fn set_pending_destroy(&self, n: i64) {
        self.pending_destroy.set(n);
    }

    /// Sets whether the start-up check `check` (`node_checks::Check::label`) found a problem.
    pub fn set_node_setup_warning(&self, check: &str, found: bool) {
        self.node_setup_warning
            .get_or_create(&CheckLabels {
                check: check.into(),
            })
            .set(i64::from(found));
    }

    /// Sets whether the API server drops the ResourceSlice fields of feature gate `gate`.
    pub fn set_feature_gate_off(&self, gate: &str, off: bool) {
        self.feature_gate_off
            .get_or_create(&GateLabels { gate: gate.into() })
            .set(i64::from(off));
    }
}

#[cfg(test)]
mod tests;
