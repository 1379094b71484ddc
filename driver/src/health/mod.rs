//! GPU health: what makes a GPU unusable, how DAS tells the scheduler and users, and when it
//! counts as recovered (docs/design.md §7, "Health").
//!
//! - [`xid`]: which XID errors are fatal (NVIDIA's catalogue and device-plugin policy).
//! - [`book`]: every GPU's health as a pure state machine over events, the inventory, the live
//!   MIG instances and time: the taints its devices carry and the reason the health stream
//!   reports; an XID naming a live GPU instance concerns only the devices overlapping it.
//! - [`unclaimed`]: the MIG instances no claim holds ([`UnclaimedInstances`], which the request
//!   path implements) and which of them have their overlapping devices withdrawn (pure).
//! - [`monitor`]: the task that waits for the backend's health events, re-reads the inventory,
//!   and acts on transitions: reports the facts publication needs (device taints, withdrawn
//!   devices) to the publisher, posts Events on the Node, sets metrics, and wakes the kubelet's
//!   health stream.
//! - What the kubelet's health stream reads ([`HealthSource`], which the monitor implements, and
//!   [`DeviceHealthReport`]) is the generic DRA layer's (`dra_plugin::health`).
//!
//! Health reports facts; it never decides what is published: `crate::publish::desired` turns
//! the facts ([`crate::publish::desired::HealthFacts`]) into ResourceSlices. Dependencies:
//! `health` → `publish` (the facts type, the device index), `events`, `gpu`, `metrics`; the
//! request path depends on `health` (it implements [`UnclaimedInstances`]), never the reverse.

pub(crate) mod book;
pub mod monitor;
pub(crate) mod unclaimed;
pub mod xid;

pub use book::{
    Cause, GpuInstance, GpuTaint, HealthBook, HealthPolicy, Scope, TaintEffect, Transition,
};
pub use dra_plugin::{DeviceHealthReport, HealthSource};
pub use monitor::HealthMonitor;
pub use unclaimed::UnclaimedInstances;
