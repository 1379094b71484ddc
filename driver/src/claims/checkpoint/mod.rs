//! The node plugin's checkpoint: the claims it prepared and the exact MIG instances it created
//! for them, kept on disk so unprepare works after a plugin restart, a half-done prepare can be
//! rolled back, and an instance is only ever destroyed by the claim that owns it
//! (docs/architecture.md, "Prepare and unprepare").
//!
//! The file is a versioned JSON document, rewritten whole and atomically on every change (temp
//! file, rename); fine for the few hundred claims a node holds. It is not fsynced: only a
//! kernel crash or a power loss can lose a write that a reader has seen, and both reboot the
//! node, which destroys every MIG instance the file describes and makes [`Checkpoint::load`]
//! discard it (new boot ID). A restarted plugin process always reads the last write. After a
//! power loss the file may also be found incomplete; it is then moved aside as corrupt (below),
//! which loses nothing, since none of the instances it described survived. (Fsyncs of the file
//! and its directory were a fifth of the plugin's CPU per prepare and the tail of its latency;
//! docs/benchmarks.md.)
//!
//! ```json
//! {
//!   "version": 10,
//!   "bootId": "0b7e…",
//!   "checksum": "crc32:1a2b3c4d",
//!   "claims": {
//!     "<claimUID>": {
//!       "namespace": "ns", "name": "claim",
//!       "state": "PrepareStarted" | "PrepareCompleted" | "Releasing" | "Carved",
//!       "devices": [{"request": "gpu", "pool": "node-a", "device": "gpu-0-mig-1g-10gb-6",
//!                    "gpuIndex": 0, "gpuUUID": "GPU-…", "profile": "1g.10gb",
//!                    "placementStart": 6, "placementSize": 2,
//!                    "instance": {"giId": 13, "ciId": 0, "migUUID": "MIG-…"},
//!                    "mps": {"activeThreadPercentage": 50, "pinnedDeviceMemoryLimitMiB": 2048}},
//!                   {"request": "share", "pool": "node-a", "device": "gpu-0-mig-1g-10gb-2-shared",
//!                    "gpuIndex": 0, "gpuUUID": "GPU-…", "profile": "1g.10gb",
//!                    "placementStart": 2, "placementSize": 1,
//!                    "instance": {"giId": 9, "ciId": 0, "migUUID": "MIG-…"}, "mps": {},
//!                    "share": {"shareID": "<UUID>", "shares": 1, "of": 4, "memoryBytes": 2684354560}},
//!                   {"kind": "gpu", "request": "whole", "pool": "node-a", "device": "gpu-1",
//!                    "gpuIndex": 1, "gpuUUID": "GPU-…", "profile": "gpu",
//!                    "placementStart": 0, "placementSize": 8, "timeSlice": "Short"}],
//!       "cdiDeviceIds": {"gpu-0-mig-1g-10gb-6": ["das.com/mig=<claimUID>-gpu-0-mig-1g-10gb-6"]},
//!       "pods": ["<podUID>"],
//!       "updatedAt": 1767225600
//!     }
//!   },
//!   "migModeSwitches": {
//!     "1": {"gpuUUID": "GPU-…", "migEnabled": false, "claim": "<claimUID>", "startedAt": 1767225600}
//!   }
//! }
//! ```
//!
//! A device's `instance` is the identity of the MIG instance created for it: GPU UUID (the
//! device's `gpuUUID`), GPU-instance ID, compute-instance ID and MIG UUID. NVML reuses GI IDs
//! after a destroy and a MIG UUID is new on every creation, so together they name one instance
//! and never its successor at the same placement. `instance` is absent only while a prepare is
//! creating the instance (and in a record left by a crash in that window).
//!
//! A device with `"kind": "gpu"` is a whole GPU (docs/design.md §7, "Whole GPUs"): no instance is
//! created for it, so it never has `instance`; its profile is `gpu` and its placement every
//! memory slice of the GPU, so it overlaps every placement of its GPU. `kind` is left out for a
//! MIG device (`"mig"`, the default).
//!
//! A device with `mps` is served with MPS (docs/design.md §7, "MPS on a slice"): `mps` holds
//! the limits its MPS control daemon sets, and the daemon (directory `<state dir>/mps/<id>`,
//! `crate::mps::layout`) runs while the record does; start-up brings it back.
//!
//! A device with `timeSlice` (version 10) is a whole GPU whose claim asked for time-slicing
//! (docs/design.md §7, "Time-slicing"): its GPU's compute time slice was set to it at prepare
//! and goes back to the driver's default when the record is released.
//!
//! A device with `share` is one claim's share of a shareable device (docs/design.md §7, "Shared
//! slices"): several records hold the same `device` and `instance`, one per share; the MIG instance
//! and its MPS control daemon (one per MIG instance, keyed by GPU UUID and device) live while any of
//! them does. The records are the reference count, so it survives restarts.
//!
//! A whole GPU's device (`"kind": "gpu"`) with `share` (version 11) is a share of a whole GPU
//! (docs/design.md §7, "Memory slices of a whole GPU"): no instance, the GPU's MPS control
//! daemon lives while a record holds a share, and `acquired: true` marks the shares that hold
//! the GPU (set under its lock), as a recorded instance marks a MIG share's.
//!
//! State `Carved` (version 8; carve before bind, issue 34): the plugin created the claim's
//! instances when the scheduler allocated them, before the pod was bound, and set the claim's
//! `mig.das.com/SliceReady` condition; the kubelet has not prepared the claim yet. Its
//! devices have their `instance`s; it has no `cdiDeviceIds`, no MPS daemon runs for it, and no
//! container was ever given its instances. The kubelet's prepare of the same allocation checks
//! the instances, starts the MPS daemons, writes the CDI spec and records `PrepareCompleted`; a
//! claim that is deleted, deallocated or allocated otherwise releases the record at once, and
//! start-up releases the `Carved` records whose claims the API server no longer allocates to
//! this node as recorded.
//!
//! Version 1 (the first release) had the instance fields flat on the device (`giId`, `ciId`,
//! `migUUID`), CDI device IDs per request, and no `Releasing` state; it is read and upgraded
//! ([`LoadOutcome::Upgraded`]), never treated as corrupt. Version 2 lacked `pods` (the UIDs of
//! the pods the claim was reserved for when it was prepared, which the orphan rule asks the
//! container runtime about); it is read as version 3 with no pods known. Version 3 lacked a
//! device's `kind` and had MIG devices only; it is read as version 4 with every device a MIG
//! device (a version-3 file's bytes are a valid version-4 document but for `version`). Version 4
//! lacked `migModeSwitches` (the MIG mode switches under way, by GPU index, docs/design.md §7, "MIG
//! mode follows demand"; left out when none); it is read as version 5 with none. Version 5
//! lacked a device's `mps` (the limits of the MPS control daemon of a device whose claim asks
//! for MPS sharing, docs/design.md §7, "MPS on a slice"; left out for an exclusive device, so
//! a version-5 file's bytes are a valid version-6 document but for `version`); it is read as
//! version 6 with every device exclusive. Version 6 lacked a device's `share` (a claim's share of
//! a shareable device, docs/design.md §7, "Shared slices": its `shareID`, the shares and memory
//! it consumes; left out for a device held alone); it is read as version 7 with no share.
//! Version 7 lacked the state `Carved` (a version-7 file's bytes are a valid version-8 document
//! but for `version`); it is read as version 8 with no carved claim. An older
//! binary moves a newer file aside as corrupt and rebuilds from the GPUs and the API server (a
//! downgrade loses no instance the API server still allocates; see docs/design.md for what it
//! costs).
//!
//! `checksum` is CRC-32 (IEEE, the `crc32fast` crate) of the compact JSON serialization of the
//! same document without the `checksum` field; map keys are sorted, so the serialization is
//! canonical and the checksum does not depend on the file's whitespace or on the Rust version.
//!
//! [`Checkpoint::load`] never panics and never fails on bad content: a new boot ID (MIG instances
//! do not survive a reboot) is reported as [`LoadOutcome::NewBoot`]; a file with unknown version,
//! bad JSON, unexpected fields or a wrong checksum is moved aside to `<name>.corrupt-<unix time>`
//! and reported as [`LoadOutcome::Corrupt`], so the caller rebuilds state from the GPU backend and
//! the API server instead of crash-looping.
//!
//! - [`format`](mod@format): the document: the record types, the checksum, encoding and
//!   decoding, and the in-memory changes ([`Checkpoint`]'s `set_*`). Pure. Its `v1` holds the
//!   first release's document, read only to upgrade it.
//! - [`store`]: the file: [`Checkpoint::load`] and [`Checkpoint::save`] (atomic, moving a
//!   corrupt file aside), the boot ID, and [`CheckpointStore`], the checkpoint the request path
//!   changes and persists with group commit.

pub(crate) mod format;
pub(crate) mod store;

pub use format::{
    CHECKPOINT_VERSION, Checkpoint, ClaimRecord, CorruptReason, DeviceKind, InstanceId,
    MigModeSwitch, PrepareState, RecordedDevice, Share,
};
pub use store::{
    BOOT_ID_PATH, CHECKPOINT_FILE_NAME, CheckpointError, CheckpointStore, LoadOutcome,
    read_boot_id, read_boot_id_from,
};

#[cfg(test)]
mod tests;
