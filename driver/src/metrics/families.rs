//! The plugin's metric families, registered by group (in this order, which is the order of
//! `/metrics`): MPS daemons, MIG mode switches, the node's set-up and API server, the
//! kubelet's requests and the releases they leave, the GPUs, and the claims' records. Each
//! group's `register` adds its families to the registry under the `das_kubelet_plugin`
//! prefix; [`super::Metrics`] sets them. Names, help texts and labels are listed in
//! docs/operations.md.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct CallLabels {
    pub(super) method: String,
    pub(super) result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct MethodLabels {
    pub(super) method: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ErrorLabels {
    pub(super) method: String,
    pub(super) cause: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct CauseLabels {
    pub(super) cause: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ResultLabels {
    pub(super) result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct GateLabels {
    pub(super) gate: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct CheckLabels {
    pub(super) check: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct SwitchLabels {
    pub(super) to: String,
    pub(super) result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct DaemonLabels {
    pub(super) daemon: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct GpuLabels {
    pub(super) gpu: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct GpuProfileLabels {
    pub(super) gpu: String,
    pub(super) profile: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct XidLabels {
    pub(super) gpu: String,
    pub(super) xid: String,
    pub(super) fatal: String,
}

/// A histogram family keyed by `L`, with [`latency_histogram`]'s buckets.
pub(super) type Latencies<L> = Family<L, Histogram, fn() -> Histogram>;

/// Buckets for latencies in seconds: 1 ms to ~16 s.
fn latency_histogram() -> Histogram {
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.001, 2.0, 15,
    ))
}

fn latencies<L: Clone + std::hash::Hash + Eq>() -> Latencies<L> {
    Family::new_with_constructor(latency_histogram)
}

/// `metric` registered as `name` with `help`, and returned (a family is a handle: the clone
/// registered and the one returned are the same series).
fn registered<M>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M
where
    M: Clone + prometheus_client::registry::Metric,
{
    registry.register(name, help, metric.clone());
    metric
}

/// The MPS control daemons the plugin supervises (docs/design.md §7, "MPS on a slice").
pub(super) struct Mps {
    pub(super) daemons: Gauge,
    pub(super) daemons_up: Gauge,
    pub(super) restarts: Family<ResultLabels, Counter>,
    pub(super) shm_size: Family<DaemonLabels, Gauge>,
    pub(super) shm_used: Family<DaemonLabels, Gauge>,
}

impl Mps {
    pub(super) fn register(r: &mut Registry) -> Self {
        Self {
            daemons: registered(
                r,
                "mps_daemons",
                "MPS control daemons the plugin supervises, one per prepared MPS slice (docs/design.md, \"MPS on a slice\"): running, or being started again after an exit",
                Gauge::default(),
            ),
            daemons_up: registered(
                r,
                "mps_daemons_up",
                "MPS control daemons that run now (of das_kubelet_plugin_mps_daemons: those not waiting to be started again after an exit); fewer than supervised means a slice's MPS clients cannot connect",
                Gauge::default(),
            ),
            restarts: registered(
                r,
                "mps_daemon_restarts",
                "Starts of an MPS control daemon after it exited (with its limits applied again), by result: ok, or failure (retried with backoff up to 30 s)",
                Family::default(),
            ),
            shm_size: registered(
                r,
                "mps_shm_size_bytes",
                "Size of each supervised MPS daemon's shm tmpfs (the /dev/shm of its slice's containers, --mps-shm-size), by daemon id (docs/design.md, \"MPS on a slice\"); a plain directory (--mps-shm-size=0) reports its file system's size",
                Family::default(),
            ),
            shm_used: registered(
                r,
                "mps_shm_used_bytes",
                "Bytes in use in each supervised MPS daemon's shm tmpfs, by daemon id (charged to the memory cgroups of the processes that wrote them); a client that reaches the size gets ENOSPC",
                Family::default(),
            ),
        }
    }
}

/// MIG mode following demand (docs/design.md §7, "MIG mode follows demand").
pub(super) struct MigMode {
    pub(super) switches: Family<SwitchLabels, Counter>,
    pub(super) switchable: Family<GpuLabels, Gauge>,
}

impl MigMode {
    pub(super) fn register(r: &mut Registry) -> Self {
        Self {
            switches: registered(
                r,
                "mig_mode_switches",
                "MIG mode switches a prepare made (docs/design.md, \"MIG mode follows demand\"), by the mode switched to (on, off) and result: ok, or the backend error's kind (reset_required, in_use, …; the GPU then keeps its mode and serves only what it serves)",
                Family::default(),
            ),
            switchable: registered(
                r,
                "gpu_mig_mode_switchable",
                "1 while DAS may switch the GPU's MIG mode to follow demand (--mig-mode-switching, Hopper or newer, no failed switch since the plugin started), 0 otherwise; per GPU index",
                Family::default(),
            ),
        }
    }
}

/// What start-up found of the node's set-up, and what the API server keeps of the slices.
pub(super) struct Node {
    pub(super) setup_warning: Family<CheckLabels, Gauge>,
    pub(super) feature_gate_off: Family<GateLabels, Gauge>,
}

impl Node {
    pub(super) fn register(r: &mut Registry) -> Self {
        Self {
            setup_warning: registered(
                r,
                "node_setup_warning",
                "1 when the start-up check found a problem in the node set-up DAS relies on, 0 when it passed (real GPUs; checked at each start): visible_devices_envvar (the NVIDIA container toolkit lets unprivileged pods ask for every GPU with NVIDIA_VISIBLE_DEVICES, or its config cannot be read), nvidia_uvm (/dev/nvidia-uvm or /dev/nvidia-uvm-tools missing: pods with DAS claims cannot start)",
                Family::default(),
            ),
            feature_gate_off: registered(
                r,
                "apiserver_feature_gate_off",
                "1 while the API server drops the ResourceSlice fields of this feature gate: DRAPartitionableDevices (shared counters; the node's MIG devices are withdrawn until it keeps them), DRADeviceTaints (unhealthy GPUs' devices stay offered untainted), DRAConsumableCapacity (the shareable devices are withdrawn until the plugin restarts); 0 once it keeps them",
                Family::default(),
            ),
        }
    }
}

/// The kubelet's prepares and unprepares, and the releases they leave to the reaper and the
/// orphan rule.
pub(super) struct Requests {
    pub(super) placement_waits: Latencies<ResultLabels>,
    pub(super) errors: Family<ErrorLabels, Counter>,
    pub(super) destroy_failures: Family<CauseLabels, Counter>,
    pub(super) reaper_attempts: Family<ResultLabels, Counter>,
    pub(super) orphan_releases: Family<ResultLabels, Counter>,
    pub(super) pending_destroy: Gauge,
    pub(super) calls: Family<CallLabels, Counter>,
    pub(super) call_seconds: Latencies<MethodLabels>,
    pub(super) backend_seconds: Latencies<MethodLabels>,
}

impl Requests {
    pub(super) fn register(r: &mut Registry) -> Self {
        Self {
            placement_waits: registered(
                r,
                "placement_wait_seconds",
                "Prepares that waited for another claim's slices at their placements (a force-deleted pod's claim not yet unprepared), by how the wait ended: released (by the kubelet's unprepare), timeout (the prepare failed with placement_held; the kubelet retries it)",
                latencies(),
            ),
            errors: registered(
                r,
                "request_errors",
                "Failed prepares and unprepares per claim, by cause (PrepareError)",
                Family::default(),
            ),
            destroy_failures: registered(
                r,
                "slice_destroy_failures",
                "Slices that could not be destroyed (they stay recorded and are retried), by backend error",
                Family::default(),
            ),
            reaper_attempts: registered(
                r,
                "reaper_attempts",
                "Retries of slice destroys left by an unprepare or a roll-back, by result",
                Family::default(),
            ),
            orphan_releases: registered(
                r,
                "orphan_releases",
                "Prepared claims the kubelet never unprepared, released by the orphan rule once the container runtime had no sandbox or container of their pods, by result (failure: slices left for the reaper)",
                Family::default(),
            ),
            pending_destroy: registered(
                r,
                "slices_pending_destroy",
                "Slices of released claims that still exist and are retried by the reaper",
                Gauge::default(),
            ),
            calls: registered(
                r,
                "requests",
                "NodePrepareResources/NodeUnprepareResources per claim, by result",
                Family::default(),
            ),
            call_seconds: registered(
                r,
                "request_duration_seconds",
                "Time to prepare or unprepare one claim",
                latencies(),
            ),
            backend_seconds: registered(
                r,
                "backend_duration_seconds",
                "Time of GPU backend operations (create, destroy, set_mig_mode)",
                latencies(),
            ),
        }
    }
}

/// Per GPU: what is prepared on it, its health, its free placements, its XID errors.
pub(super) struct Gpus {
    pub(super) prepared: Family<GpuLabels, Gauge>,
    pub(super) memory_slices_in_use: Family<GpuLabels, Gauge>,
    pub(super) healthy: Family<GpuLabels, Gauge>,
    pub(super) free_placements: Family<GpuProfileLabels, Gauge>,
    pub(super) xid_events: Family<XidLabels, Counter>,
}

impl Gpus {
    pub(super) fn register(r: &mut Registry) -> Self {
        Self {
            prepared: registered(
                r,
                "prepared_slices",
                "MIG instances prepared for claims, per GPU index",
                Family::default(),
            ),
            memory_slices_in_use: registered(
                r,
                "gpu_memory_slices_in_use",
                "Memory slices covered by the placements of prepared MIG instances, per GPU index",
                Family::default(),
            ),
            healthy: registered(
                r,
                "gpu_healthy",
                "1 while the GPU is healthy, 0 while it is lost or after a fatal XID or ECC error (its devices carry taints), per GPU index",
                Family::default(),
            ),
            free_placements: registered(
                r,
                "free_placements",
                "Placements of a profile where a new MIG instance could be created now, per GPU index and profile (0 on every GPU: a pod asking for that profile waits)",
                Family::default(),
            ),
            xid_events: registered(
                r,
                "xid_events",
                "XID errors the GPUs reported, by GPU index, XID and whether the health policy treats it as fatal",
                Family::default(),
            ),
        }
    }
}

/// The claims' records: carved before bind, guards without instances, status writes.
pub(super) struct Claims {
    pub(super) carves: Family<ResultLabels, Counter>,
    pub(super) carved: Gauge,
    pub(super) repairing: Gauge,
    pub(super) status_write_failures: Counter,
}

impl Claims {
    pub(super) fn register(r: &mut Registry) -> Self {
        Self {
            carves: registered(
                r,
                "carves",
                "Carves before bind of a claim's slices (issue 34), by result (ok, failed)",
                Family::default(),
            ),
            carved: registered(
                r,
                "carved_slices",
                "Slices carved before bind that no prepare has taken yet",
                Gauge::default(),
            ),
            repairing: registered(
                r,
                "repairing_claims",
                "Claims the kubelet holds as prepared whose instances are gone (a repair that did not finish): their records keep holding their placements until the kubelet unprepares them (docs/design.md, \"A slice leaves its claim\")",
                Gauge::default(),
            ),
            status_write_failures: registered(
                r,
                "claim_status_write_failures",
                "Failed writes of a claim's status.devices",
                Counter::default(),
            ),
        }
    }
}
