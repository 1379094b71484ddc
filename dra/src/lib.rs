//! `dra-plugin`: the node side of a Kubernetes DRA (Dynamic Resource Allocation) driver, for any
//! kind of device. The Rust counterpart of Go's `k8s.io/dynamic-resource-allocation/kubeletplugin`
//! and `resourceslice`: plugin registration, the DRA `v1` and `v1beta1` gRPC services on one
//! socket, the `v1alpha1` resource-health stream, the handover between two instances of the
//! plugin on one node during a rolling update, and the controller that keeps the node's
//! ResourceSlices published. It knows nothing of any one driver's devices: the driver name, the
//! socket directories, what a prepare does, where device health comes from and which devices
//! are published are the caller's.
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
//! To publish, a driver gives the [`resourceslice::Pool`] (its name, the node) and its devices
//! as the desired ResourceSlice specs, in priority order, without `driver`, `pool` or
//! `nodeName`: once to [`resourceslice::Publisher::publish_first`], then as a `watch` channel to
//! [`resourceslice::Publisher::run`] (or any input and a function of it to
//! [`resourceslice::Publisher::run_with`]). Optionally it implements
//! [`resourceslice::NodeEvents`] (where the publisher's notices about the API server's feature
//! gates go, and in which words; [`resourceslice::KubeNodeEvents`] posts them with a kube event
//! recorder) and [`resourceslice::GateGauge`] (a gauge per feature gate).
//!
//! # What the crate does
//!
//! - [`kubeletplugin`]: [`kubeletplugin::SocketPaths`] (the kubelet's naming conventions, per pod
//!   during a rolling update) and [`kubeletplugin::serve`], which serves a [`Driver`] and a
//!   [`HealthSource`] until told to stop, registering with the kubelet once the DRA socket
//!   answers and deregistering first on the way out. It requires the
//!   [`resourceslice::FirstPublish`] that only a successful
//!   [`resourceslice::Publisher::publish_first`] makes, so a plugin cannot register before its
//!   devices are published.
//! - [`handover`]: one active instance per node (a `flock` on `<state dir>/plugin.lock`), and
//!   the bounded handover to a newer instance: [`handover::check_then_take_over`],
//!   [`handover::Gate`], [`handover::Background`], [`handover::hand_over_when_asked`].
//! - [`resourceslice`]: the node's pool on the API server ([`resourceslice::Publisher`]): slice
//!   names, `resourceSliceCount` and generations as upstream keeps them, the writes and the
//!   deletes of obsolete slices, republishing when someone else changes them, a resync and, since
//!   an API server with a feature gate off silently drops that gate's fields, a guard that never
//!   offers a device without them (shared counters probed with a dry run; the pool published
//!   empty while they are dropped; shareable devices and binding conditions left out once
//!   dropped; docs/design.md §4). Publish before serving, so the scheduler can place pods as soon
//!   as the kubelet reaches the plugin: the types keep that order (below).
//! - `testing` (feature `testing`): a mocked API server and a fake ResourceSlice registry whose
//!   gates can be off, for a driver's tests.
//!
//! Protocol facts, with their sources, are in docs/reference/dra.md, "Kubelet plugin protocol"
//! and "ResourceSlice publishing".
//!
//! # Start-up order
//!
//! Each step makes what the next one requires, so the order cannot be broken by moving a line:
//!
//! 1. [`handover::check_then_take_over`] runs the driver's checks, then waits for the node: the
//!    [`handover::Active`] it returns (made only by taking the node's lock) is what
//!    [`handover::hand_over_when_asked`] later gives up;
//! 2. the driver loads its records and reconciles them (its own order);
//! 3. [`resourceslice::Publisher::publish_first`] publishes the node's pool and returns the
//!    [`resourceslice::FirstPublish`] proof;
//! 4. [`kubeletplugin::serve`] requires that proof, and registers with the kubelet only once
//!    its DRA socket answers;
//! 5. [`handover::hand_over_when_asked`] consumes the [`handover::Active`].
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
//! use dra_plugin::resourceslice::{KubeNodeEvents, Pool, Publisher, RunConfig};
//! use dra_plugin::{ClaimRef, DeviceHealthReport, Driver, HealthSource, PreparedDevice};
//! use k8s_openapi::api::resource::v1::{Device, ResourceSliceSpec};
//! use tokio::sync::watch;
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
//! let client = kube::Client::try_default().await?;
//! let pool = Pool::new("dev.example.com", "node-a");
//! let events = KubeNodeEvents::new(client.clone(), "example-kubelet-plugin", &pool.node);
//! let mut publisher = Publisher::new(client, pool).with_events(Arc::new(events));
//! let device = Device { name: "dev-0".into(), ..Default::default() };
//! let desired = vec![ResourceSliceSpec { devices: Some(vec![device]), ..Default::default() }];
//! let (_stats, first) = publisher.publish_first(desired.clone()).await?;
//! let (_slices, slices) = watch::channel(desired); // send the new specs when devices change
//! let stop = CancellationToken::new();
//! let mut background = Background::default();
//! let publish_stop = stop.child_token();
//! background.spawn("ResourceSlice publisher", publish_stop.clone(), async move {
//!     publisher.run(slices, publish_stop, RunConfig::default()).await;
//! });
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
//!         let (name, shutdown) = ("dev.example.com", stop.cancelled_owned());
//!         kubeletplugin::serve(&first, &paths, name, driver, devices, shutdown).await
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

// Product functions stay under 80 code lines (clippy.toml); tests may be longer.
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

pub mod driver;
pub mod handover;
pub mod health;
pub mod kubeletplugin;
pub mod resourceslice;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use driver::{ClaimRef, Driver, PreparedDevice};
pub use health::{DeviceHealthReport, HealthSource};
