//! The ResourceSlice controller of one node's pool: keeps the driver's slices of this node on the
//! API server equal to the desired ones, the way Go's
//! `k8s.io/dynamic-resource-allocation/resourceslice` controller does
//! (`resourceslicecontroller.go`; docs/reference/dra.md, "ResourceSlice publishing"; KEP-4815
//! for counter slices), and never offers a device in a way the scheduler would misread because
//! the API server dropped a gated field ("no silent overlap", docs/design.md §4).
//!
//! - Pool ([`Pool`]): one per node, named after the node; `spec.nodeName` = the node; every
//!   slice carries `resourceSliceCount` = number of desired slices and the pool generation.
//! - Names: `<index hex, ≥5 digits>-<driver>-<node>` ([`plan::slice_name`]): deterministic, and
//!   sorted by name in the desired (priority) order, which the 1.36+ allocator follows.
//! - Generation: kept when no slice is new and at most one changes, otherwise bumped and every
//!   slice rewritten ([`plan::decide_generation`]).
//! - Obsolete slices (other pool, lower generation, foreign name, index beyond the count) are
//!   deleted first, with UID and resourceVersion preconditions.
//! - Nothing is written when the stored slices already match ([`plan::spec_key`]).
//! - Dropped fields: after each write the stored spec is compared with the sent one; a
//!   difference (a disabled feature gate, a canonicalized value) is logged once and adopted as
//!   the baseline ([`plan::Adopted`]), so the next publish does not update again.
//! - Feature gates ([`gates`]): before slices with shared counters are published the first
//!   time (and again at most every 5 min), a dry-run create of one of them shows whether the
//!   API server keeps the counters (`DRAPartitionableDevices`), and every write is checked;
//!   while the server drops them the pool is published empty (devices withdrawn) and the probe
//!   is repeated with backoff until the devices can be republished. Dropped device taints
//!   (`DRADeviceTaints`) leave the devices published. Dropped consumable capacity
//!   (`DRAConsumableCapacity`) withdraws the shareable devices at once and for the publisher's
//!   life; dropped binding conditions (`DRADeviceBindingConditions`) republish the devices
//!   without them, at once and for the publisher's life. Each is a [`Notice`]: a log line, an
//!   Event on the Node ([`NodeEvents`]) and a gauge ([`GateGauge`]).
//! - Owner: the Node (`controller: true`), so slices go with the Node.
//! - An empty desired list publishes one empty slice: "empty pool" differs from "no pool".
//!
//! [`Publisher::run`] (and [`Publisher::run_with`]) republishes when someone else changes or
//! deletes the pool's slices (the kubelet wipes a node's slices when it starts and 30 s after a
//! plugin disconnects), when the desired slices change, on a periodic resync, and when the
//! withdrawn devices' next probe is due.
//!
//! # What a driver provides
//!
//! - the [`Pool`]: its driver name and the node (and the Node's UID, if it knows it);
//! - the desired slices, in priority order, as `ResourceSliceSpec`s without `driver`, `pool`
//!   or `nodeName` (the publisher sets them): once to [`Publisher::publish`] (before the
//!   plugin serves the kubelet: [`Publisher::publish_first`], whose [`FirstPublish`]
//!   [`crate::kubeletplugin::serve`] requires), or as a [`tokio::sync::watch`] channel to
//!   [`Publisher::run`];
//! - optionally [`NodeEvents`] (the Events its notices become, and their notes: the default
//!   notes are [`Notice::note`]; [`KubeNodeEvents`] posts them with a kube event recorder), a
//!   [`GateGauge`], and which devices are shareable when it marks them otherwise than by
//!   `allowMultipleAllocations` ([`Publisher::with_shareable`]).
//!
//! The API calls go through [`PublishApi`] ([`KubePublishApi`] over a kube client), so tests can
//! drive the publisher with chosen answers (`testing::FakeSliceApi`, feature `testing`).
//! [`ServerVersion`] reads the API server's `/version` and says which gated fields a server of
//! that version can be given.
//!
//! Parts: [`plan`] (the pure write plan), [`gates`] (the pure publication guard and its
//! notices), `publisher` (the I/O: [`Publisher`], its API, the run loop), `version`.

mod events;
pub mod gates;
pub mod plan;
mod publisher;
mod version;

pub use events::{KubeNodeEvents, MAX_NOTE_BYTES, POST_TIMEOUT};
pub use gates::{Notice, Shareable, allows_multiple_allocations};
pub use publisher::{
    KubePublishApi, PublishApi, PublishError, PublishStats, PublishTotals, Publisher, RunConfig,
};
pub use version::{ServerVersion, Unsupported};

/// Proof that the pool was published: made only by [`Publisher::publish_first`] once a publish
/// succeeded (the API server holds the desired slices, or, while it drops shared counters, the
/// pool without devices), and required by [`crate::kubeletplugin::serve`]. So a plugin never
/// registers with the kubelet before its first publish: the scheduler can place pods on the
/// node as soon as the kubelet reaches the plugin. (Go's `kubeletplugin` leaves this order to
/// the driver.)
///
/// ```compile_fail,E0423
/// use dra_plugin::resourceslice::FirstPublish;
/// // Claiming a publish that never happened does not compile: the field is private.
/// let first = FirstPublish(());
/// ```
#[derive(Debug)]
pub struct FirstPublish(());

/// The pool a [`Publisher`] keeps: one node's devices of one driver (upstream
/// `resourceslice.Options.DriverName` and a `Pool` with `NodeName` set).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool {
    /// The DRA driver name: `spec.driver` of every slice, and part of every slice name (a DNS
    /// subdomain such as `dev.example.com`; the API server refuses slices with any other).
    pub driver: String,
    /// The node: the pool's name and `spec.nodeName` of every slice.
    pub node: String,
    /// The Node's UID, for the owner reference of every slice; `None`: looked up at the first
    /// publish, and again before creating slices (in case the Node was re-registered).
    pub node_uid: Option<String>,
}

impl Pool {
    /// The pool of `driver` on `node`, the Node's UID to be looked up.
    pub fn new(driver: impl Into<String>, node: impl Into<String>) -> Self {
        Self {
            driver: driver.into(),
            node: node.into(),
            node_uid: None,
        }
    }

    /// With the Node's UID given (never looked up, never refreshed).
    pub fn with_node_uid(mut self, uid: impl Into<String>) -> Self {
        self.node_uid = Some(uid.into());
        self
    }

    /// The field selector of the pool's slices: `spec.driver=<driver>,spec.nodeName=<node>`.
    pub fn field_selector(&self) -> String {
        format!("spec.driver={},spec.nodeName={}", self.driver, self.node)
    }
}

/// Where the publisher's [`Notice`]s go besides the log: Events about the pool's Node.
///
/// A driver implements it to post through its own event recorder (its reporting component, its
/// length limits), and may word the notes in its own terms ([`Self::note`]).
#[tonic::async_trait]
pub trait NodeEvents: Send + Sync + 'static {
    /// The note of `notice` about `pool`: what happened, what the publisher did, what to do.
    /// It is also the log line. Default: [`Notice::note`].
    fn note(&self, notice: &Notice, pool: &Pool) -> String {
        notice.note(pool)
    }

    /// Posts `notice` as an Event about the pool's Node: type Warning when
    /// [`Notice::is_warning`], else Normal; reason [`Notice::reason`]; `note` from
    /// [`Self::note`]. Best effort: the implementation logs a failure, the publisher goes on.
    async fn post(&self, notice: &Notice, note: String);
}

/// A gauge of the API server's feature gates as the publisher last saw them (one time series
/// per gate, e.g. `<prefix>_apiserver_feature_gate_off{gate="DRADeviceTaints"}`), set after
/// every publish.
pub trait GateGauge: Send + Sync + 'static {
    /// `gate` (a feature gate's name, e.g. `DRAPartitionableDevices`) is off (`true`: the
    /// server was last seen dropping its fields) or not.
    fn set_gate_off(&self, gate: &'static str, off: bool);
}
