//! The request path: what NodePrepareResources and NodeUnprepareResources do to a claim, the
//! start-up reconciliation, and the reaper that finishes destroys that failed.
//!
//! - [`preparer`]: [`Preparer`], the transaction: the claim's lock, reading the claim, the
//!   checkpoint's changes, the wait for placements another claim holds, the GPU locks, the
//!   roll-back, the guard of a record the kubelet holds, the CDI spec and the status. Every one
//!   of its methods (prepare, acquire, release, start-up, reaper and orphan-rule passes,
//!   gauges) is in one of its submodules.
//! - [`plan`]: the transaction's rules, as pure functions (which allocation results are ours,
//!   which live instance is which recorded instance, what a retried prepare may reuse, what
//!   start-up destroys). Unit-tested without I/O.
//! - [`kinds`]: the device kinds behind one trait ([`kinds::Kind`], the registry
//!   [`kinds::Kinds`]): a MIG instance, a whole GPU, a shared slice, each in its own folder with
//!   its pure decisions beside its I/O. The transaction asks each device's kind what differs
//!   between kinds and never names one; no kind imports another.
//! - [`layers`]: what any kind can wear ([`layers::Layer`]): MPS, whose control daemon runs on a
//!   prepared MIG instance for its claim's containers.
//! - [`gpu_mode`]: MIG mode follows demand: whether a prepare switches its GPU's MIG mode, the
//!   switch under the GPU's lock, its recovery at start-up.
//! - [`startup`]: start-up reconciliation of checkpoint, GPUs and API server: its steps, its
//!   [`Report`] and its [`StartupError`].
//! - [`reaper`]: retries the destroys of instances whose claim is gone, with backoff (its
//!   schedule; the passes are [`preparer::reaper`]'s).
//! - [`orphans`]: the orphan rule: when a prepared claim the kubelet never unprepares may be
//!   released, on the container runtime's evidence ([`cri`], its CRI client); its policy and
//!   suspects (the checks are [`preparer::orphans`]'s).
//! - [`carve`]: carve before bind (issue 34): which claims are carved or released and the
//!   status bodies (pure; the carve itself is [`preparer::carve`]'s); [`carve_watch`], the
//!   watch of the claims allocated to this node that drives it.
//! - [`status`]: writes a claim's `status.devices`, retrying until it lands or the claim is gone.
//! - [`unclaimed`]: the MIG instances no claim holds, as the health monitor asks for them
//!   (`crate::health::unclaimed::UnclaimedInstances`).
//! - [`handler`]: what the kubelet-facing server calls ([`ClaimHandler`]) and the claim and
//!   device types it passes.
//! - [`checkpoint`]: the versioned, atomically written record of prepared claims and the exact
//!   MIG instances they hold: its document ([`checkpoint::format`], pure) and its file
//!   ([`checkpoint::store`], [`checkpoint::CheckpointStore`]).
//! - [`cdi`]: CDI spec types and DAS's per-claim spec ([`cdi::schema`], [`cdi::spec`], pure),
//!   and their files ([`cdi::files`], [`cdi::CdiWriter`]).
//! - [`driver_files`]: the driver's libraries and tools every claim's spec mounts.
//! - [`memory_limits`]: the CDI `createRuntime` hook that caps a container's GPU memory (cgroup
//!   v2 `dmem`; docs/design.md §7, "Memory limits the kernel enforces"), its runner and its
//!   installed executable.
//! - [`api`]: [`ClaimApi`], the API-server calls the request path makes, and its kube client.
//! - [`locks`]: per-claim serialization ([`ClaimLocks`]).
//! - [`error`]: [`PrepareError`], turned into text only at the gRPC boundary.
//! - [`spans`]: the `tracing` span of one claim's work (`claim.uid`, `claim.namespace`,
//!   `claim.name` on every line logged for it).
//!
//! The rules (also in docs/architecture.md, "Concurrency and slice identity"):
//! 1. Calls for one claim UID run one after another; calls for different claims run in
//!    parallel, one GPU's backend calls one at a time.
//! 2. An instance is the exact MIG instance recorded for it (GPU UUID, GI ID, CI ID, MIG UUID);
//!    anything else at the same placement is not ours.
//! 3. A record is dropped only when its instances are confirmed gone.
//! 4. A prepared claim's MIG instances go only on the kubelet's unprepare of that claim (or the orphan
//!    rule's evidence that no container of its pods is left): never because another claim
//!    wants the placement, nor because the API server no longer has the claim.
//!
//! A device whose claim asks for MPS (docs/design.md §7, "MPS on a slice") takes the same path
//! wearing the MPS layer: once its instance exists, and before the CDI spec is written, its
//! MIG instance's MPS control daemon is started ([`crate::mps`], [`layers`]); its release stops the
//! daemon before it destroys the instance. Its record carries its limits (checkpoint version
//! 6), so start-up brings the daemon back.
//!
//! A whole GPU (docs/design.md §7, "Whole GPUs") takes the same path with nothing created (its
//! kind makes no instance): a prepare checks that its GPU has MIG mode off
//! ([`PrepareError::WholeGpuUnavailable`]), records it (profile `gpu`, every memory slice of the
//! GPU, no instance: checkpoint version 4) and writes a CDI spec with the GPU's device node; its
//! release destroys nothing. Its placement overlaps every placement of its GPU, so rules 3 and
//! 4 hold between it and the GPU's MIG instances.

pub mod carve;
pub mod carve_watch;
pub mod cdi;
pub mod checkpoint;
pub(crate) mod claim_api;
pub mod container_marks;
pub mod cri;
pub mod driver_files;
pub(crate) mod error;
pub(crate) mod gpu_mode;
pub(crate) mod handler;
pub(crate) mod kinds;
pub(crate) mod layers;
pub(crate) mod locks;
pub mod memory_limits;
pub mod orphans;
pub(crate) mod plan;
pub(crate) mod preparer;
pub(crate) mod reaper;
pub(crate) mod spans;
pub(crate) mod startup;
pub(crate) mod status;
pub(crate) mod unclaimed;

#[cfg(test)]
mod claim_api_tests;
#[cfg(test)]
mod guard_tests;
#[cfg(test)]
mod mig_mode_race_tests;
#[cfg(test)]
mod mig_mode_tests;
#[cfg(test)]
mod model_tests;
#[cfg(test)]
mod mps_tests;
#[cfg(test)]
mod regression_tests;
#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod whole_gpu_tests;

pub use crate::events::{EventKind, EventSink, EventTarget};
pub use claim_api::{ApiError, ClaimApi, KubeClaimApi};
pub use error::{PrepareError, ShareRefusal};
pub use handler::{ClaimHandler, ClaimRef, PreparedDevice};
pub use locks::ClaimLocks;
pub use orphans::{OrphanPolicy, PodContainers, RuntimeError};
pub use plan::{DeviceRef, device_index};
pub use preparer::{BlockingCalls, Carved, Preparer, PreparerConfig};
pub use startup::{Report, StartupError};
