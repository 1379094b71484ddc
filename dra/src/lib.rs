//! `dra-plugin`: the kubelet side of a Kubernetes DRA (Dynamic Resource Allocation) driver, for
//! any kind of device. The Rust counterpart of Go's
//! `k8s.io/dynamic-resource-allocation/kubeletplugin`: plugin registration, the DRA `v1` and
//! `v1beta1` gRPC services on one socket, the `v1alpha1` resource-health stream, and the
//! handover between two instances of the plugin on one node during a rolling update. It knows
//! nothing of any one driver's devices: the driver name, the socket directories, what a prepare
//! does and where device health comes from are the caller's.
//!
//! # What a driver implements
//!
//! - [`Driver`]: `prepare` and `unprepare` of the claims the kubelet passes ([`ClaimRef`]),
//!   answering, per claim UID, the prepared devices ([`PreparedDevice`]: pool, device, CDI
//!   device IDs) or the driver's own error ([`Driver::Error`], whose text reaches the kubelet
//!   after the claim's name). Both calls must be idempotent: the kubelet retries.
//! - [`HealthSource`]: every published device's health ([`DeviceHealthReport`]), and
//!   optionally a watch that says when it may have changed.
//!
//! To run behind the handover gate ([`handover::Gated`]) the driver's error also converts from
//! [`handover::GateError`] (the gate's answers: handed over, or a call that panicked).
//!
//! # What the crate does
//!
//! - [`kubeletplugin`]: [`kubeletplugin::SocketPaths`] (the kubelet's naming conventions, per pod
//!   during a rolling update) and [`kubeletplugin::serve`], which serves a [`Driver`] and a
//!   [`HealthSource`] until told to stop, registering with the kubelet once the DRA socket
//!   answers and deregistering first on the way out.
//! - [`handover`]: one active instance per node (a `flock` on `<state dir>/plugin.lock`), and
//!   the bounded handover to a newer instance: [`handover::check_then_take_over`],
//!   [`handover::Gate`], [`handover::Background`], [`handover::hand_over_when_asked`].
//!
//! Publishing the driver's ResourceSlices is the driver's own (publish them before serving, so
//! the scheduler can place pods as soon as the kubelet reaches the plugin). Protocol facts, with
//! their sources, are in docs/reference/dra.md, "Kubelet plugin protocol".
//!
//! # Wiring
//!
//! A plugin for driver `dev.example.com` whose devices are always healthy; `check` stands for
//! whatever can fail without touching the node (opening the devices), and the state dir holds
//! whatever the driver records:
//!
//! ```no_run
//! use std::collections::HashMap;
//! use std::path::Path;
//! use std::sync::Arc;
//!
//! use dra_plugin::handover::{self, Background, Ended, Gate, GateError, Gated, Limits};
//! use dra_plugin::kubeletplugin::{self, SocketPaths};
//! use dra_plugin::{ClaimRef, DeviceHealthReport, Driver, HealthSource, PreparedDevice};
//! use tokio_util::sync::CancellationToken;
//!
//! #[derive(Debug, thiserror::Error)]
//! enum Error {
//!     #[error("no device is allocated to the claim")]
//!     NotAllocated,
//!     #[error(transparent)]
//!     Gate(#[from] GateError),
//! }
//!
//! struct Devices;
//!
//! #[tonic::async_trait]
//! impl Driver for Devices {
//!     type Error = Error;
//!     async fn prepare(
//!         &self,
//!         claims: Vec<ClaimRef>,
//!     ) -> HashMap<String, Result<Vec<PreparedDevice>, Error>> {
//!         // Read each claim's allocation, make its devices ready, write their CDI spec.
//!         claims.into_iter().map(|c| (c.uid, Err(Error::NotAllocated))).collect()
//!     }
//!     async fn unprepare(&self, claims: Vec<ClaimRef>) -> HashMap<String, Result<(), Error>> {
//!         claims.into_iter().map(|c| (c.uid, Ok(()))).collect()
//!     }
//! }
//!
//! #[tonic::async_trait]
//! impl HealthSource for Devices {
//!     async fn device_health(&self) -> Vec<DeviceHealthReport> {
//!         vec![]
//!     }
//! }
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let state_dir = Path::new("/var/lib/example");
//! handover::restrict_state_dir(state_dir)?;
//! let check = || -> Result<(), std::io::Error> { Ok(()) };
//! let ((), active) = handover::check_then_take_over(state_dir, handover::POLL, check).await?;
//! // Active: load the records, reconcile, publish the ResourceSlices, then serve.
//! let stop = CancellationToken::new();
//! let background = Background::default(); // .spawn("publisher", token, task) for each task
//! let devices = Arc::new(Devices);
//! let gate = Arc::new(Gate::default());
//! let driver = Arc::new(Gated { inner: devices.clone(), gate: gate.clone() });
//! let paths = SocketPaths::new(
//!     Path::new("/var/lib/kubelet/plugins_registry"),
//!     Path::new("/var/lib/kubelet/plugins"),
//!     "dev.example.com",
//!     None, // the pod's UID during a rolling update with surge
//! )?;
//! let server = tokio::spawn({
//!     let stop = stop.clone();
//!     async move {
//!         kubeletplugin::serve(&paths, "dev.example.com", driver, devices, stop.cancelled_owned())
//!             .await
//!     }
//! });
//! let probe = Arc::new(das_runtime::probes::Probe::default());
//! let ended = handover::hand_over_when_asked(active, gate, background, probe, stop.clone(), Limits::PLUGIN)
//!     .await;
//! stop.cancel(); // on SIGTERM too
//! server.await??;
//! assert_ne!(ended, Ended::Stuck, "exit at once when Stuck: calls still run");
//! # Ok(())
//! # }
//! ```

pub mod driver;
pub mod handover;
pub mod health;
pub mod kubeletplugin;
pub mod resourceslice;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use driver::{ClaimRef, Driver, PreparedDevice};
pub use health::{DeviceHealthReport, HealthSource};
