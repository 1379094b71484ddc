//! GPU health: what makes a GPU unusable, how DAS tells the scheduler and users, and when it
//! counts as recovered (docs/design.md §7, "Health").
//!
//! - [`xid`]: which XID errors are fatal (NVIDIA's catalogue and device-plugin policy).
//! - [`book`]: every GPU's health as a pure state machine over events, the inventory, the live
//!   MIG instances and time: the taints its devices carry and the reason the health stream
//!   reports; an XID naming a live GPU instance concerns only the devices overlapping it.
//! - [`monitor`]: the task that waits for the backend's health events, re-reads the inventory,
//!   and acts on transitions: republishes the ResourceSlices with device taints, posts Events on
//!   the Node, sets metrics, and serves the kubelet's health stream.

pub mod book;
pub mod monitor;
pub mod xid;

pub use book::{
    Cause, GpuInstance, GpuTaint, HealthBook, HealthPolicy, Scope, TaintEffect, Transition,
};
pub use monitor::HealthMonitor;
