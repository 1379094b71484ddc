//! The DAS node plugin (`das-kubelet-plugin`): publishes this node's MIG placements as
//! ResourceSlices and carves a MIG instance per allocated device when the kubelet prepares a
//! claim. Four paths, one folder each, plus the GPUs underneath:
//!
//! - [`plugin`]: the kubelet-facing server (registration, DRA and health gRPC services) and the
//!   handover between plugin instances on one node: the generic DRA layer's (crate
//!   `dra_plugin`, folder `dra/`, which knows no MIG, NVML or GPU), re-exported. The request
//!   path implements its `Driver` trait (`claims::ClaimHandler`), the health monitor its
//!   `HealthSource`.
//! - [`claims`]: the request path: prepare and unprepare of claims (pure decisions in
//!   `claims::plan`, I/O in `claims::preparer`, which holds every method of the `Preparer`),
//!   start-up reconciliation, the reaper, the checkpoint and the CDI specs (each its format,
//!   pure, apart from its files).
//! - [`publish`]: the desired ResourceSlices (devices, counter sets, layout), the placement
//!   policy (the order devices are listed in), what the node's health changes in them (device
//!   taints, withdrawn devices: `publish::desired`, pure) and the publisher that keeps them on
//!   the API server (the generic DRA layer's, `dra_plugin::resourceslice`, for the
//!   `mig.das.com` pool, with DAS's Node events and gauge). The one owner of what is published.
//! - [`health`]: GPU health (XIDs, ECC errors, lost GPUs) and MIG instances no claim holds: a
//!   pure state machine and the monitor task, which reports facts to the publisher, posts Node
//!   events and serves the kubelet's health stream.
//! - [`gpu`]: GPU models and MIG profile tables (data files), the backend trait, and the
//!   emulated and NVML backends.
//! - [`blocking`]: where blocking backend and file calls run (threads, or inline in tests).
//! - [`mps`]: MPS on a slice: the MPS control daemon of each slice whose claim asks for MPS
//!   sharing (its directories, commands and limits, pure; the process and its supervision; the
//!   emulated GPUs' stand-in daemon).
//! - [`metrics`]: the plugin's Prometheus metrics (served by `das_runtime::probes`).
//! - [`node_checks`]: start-up checks of the node set-up the CDI specs rely on (the NVIDIA
//!   container toolkit's config, the unified-memory device nodes), reported as Node events.
//! - [`events`]: the Kubernetes Events the plugin posts (about the Node or a claim), behind a
//!   trait every part posts through.
//!
//! Dependencies point one way, without circles: `claims` → `health` → `publish` →
//! `gpu` → `blocking`, each part also using any further down the chain and `events` and
//! `metrics`; `claims` → `mps` → `metrics`; `node_checks` → `events`, `metrics`; `events`,
//! `metrics`, `blocking` and `plugin` (re-exports of the DRA layer) depend on nothing of the
//! crate. (`claims` → `health`: the request path tells the health monitor which MIG
//! instances no claim holds; health never reads claims.) The design is in
//! docs/design.md; how the parts run together in docs/architecture.md.

// Product functions stay under 80 code lines (clippy.toml); tests may be longer.
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

pub mod blocking;
pub mod claims;
pub(crate) mod events;
pub mod gpu;
pub mod health;
pub mod metrics;
#[cfg(test)]
mod mock_api_server;
pub mod mps;
pub mod node_checks;
pub mod plugin;
pub mod publish;
