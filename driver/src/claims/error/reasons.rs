//! Why a device cannot be prepared, in the words users read: each reason is a variant whose
//! `Display` is the text the kubelet shows in the pod's events after the claim and the device
//! (e2e tests and docs quote these texts: change them only with them). The [`PrepareError`]
//! variant carries it: [`PrepareError::Share`] as a [`ShareRefusal`]; the others as its text
//! (their `reason` fields are strings, which other sources fill too).
//!
//! [`PrepareError`]: super::PrepareError
//! [`PrepareError::Share`]: super::PrepareError::Share

use das_api::device_config::QuantityError;

use crate::gpu::BackendError;

/// Why a GPU's MIG mode is not what a device needs and is not switched for it (the `reason` of
/// [`super::PrepareError::MigModeSwitch`]; docs/design.md §7, "MIG mode follows demand").
/// `have` is the mode the GPU has, `on` or `off`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModeRefusal {
    /// DAS does not switch the GPU (`why`), and the device needs MIG mode on.
    #[error(
        "it has MIG mode {have} and DAS does not switch it ({why}); ask for a whole GPU (DeviceClass {}) or switch MIG mode on by hand (`nvidia-smi -i {gpu} -mig 1`, then a GPU reset where needed) and restart the plugin",
        das_api::DEVICE_CLASS_WHOLE_GPU
    )]
    NotSwitchedOn {
        /// The GPU's index.
        gpu: u32,
        /// Its MIG mode now.
        have: &'static str,
        /// Why DAS does not switch it.
        why: String,
    },
    /// DAS does not switch the GPU (`why`), and the device needs MIG mode off.
    #[error(
        "it has MIG mode {have} and DAS does not switch it ({why}); ask for a MIG slice (DeviceClass {}) or switch MIG mode off by hand (`nvidia-smi -i {gpu} -mig 0`, then a GPU reset where needed) and restart the plugin",
        das_api::DEVICE_CLASS_ALL
    )]
    NotSwitchedOff {
        /// The GPU's index.
        gpu: u32,
        /// Its MIG mode now.
        have: &'static str,
        /// Why DAS does not switch it.
        why: String,
    },
    /// Other claims hold devices on the GPU that need the mode it has.
    #[error(
        "it has MIG mode {have} and devices on it that need that mode are still prepared for {}; the kubelet retries, and the switch happens once they are unprepared",
        .holders.join(", ")
    )]
    Held {
        /// Its MIG mode now.
        have: &'static str,
        /// The holding claims, as `claim <namespace>/<name> (<uid>)`.
        holders: Vec<String>,
    },
    /// MIG instances no claim holds stand in the way of a switch off.
    #[error(
        "{count} MIG instance(s) exist on it that no claim holds (made outside DAS, or not yet destroyed); MIG mode can be switched off only once they are gone: list them with `nvidia-smi mig -i {gpu} -lgi`, destroy those nobody uses (`nvidia-smi mig -i {gpu} -dci -gi <id>`, then `-dgi -gi <id>`), and the kubelet's retry switches; or delete the pod and ask for a MIG slice (DeviceClass {})",
        das_api::DEVICE_CLASS_ALL
    )]
    UnclaimedInstances {
        /// The GPU's index.
        gpu: u32,
        /// How many MIG instances exist on it.
        count: usize,
    },
    /// The GPU's MIG instances could not be listed before a switch off.
    #[error("its MIG instances cannot be listed ({0}); the kubelet retries")]
    Unlisted(BackendError),
    /// The switch failed; DAS no longer switches the GPU.
    #[error(
        "switching failed ({error}); the GPU has MIG mode {have}, DAS no longer switches it and publishes only what that mode serves, so delete the pod to have its claim allocated elsewhere"
    )]
    SwitchFailed {
        /// What the backend answered.
        error: BackendError,
        /// The mode the GPU has after the attempt.
        have: &'static str,
    },
    /// The claim's devices on one GPU need both modes.
    #[error(
        "the claim was also allocated {other} on this GPU, which needs the other mode; a whole GPU and a slice of one GPU are never allocated together while the counters are published (check `kubectl get resourceslices` for this node's counter sets), so delete the pod to have its claim allocated again"
    )]
    MixedModes {
        /// The claim's other device on the GPU.
        other: String,
    },
}

/// Why an allocated whole GPU cannot be prepared here (the `reason` of
/// [`super::PrepareError::WholeGpuUnavailable`]; docs/design.md §7, "Whole GPUs").
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WholeGpuRefusal {
    /// A device named like a whole GPU that this node does not publish.
    #[error(
        "this node does not publish it: the plugin serves whole GPUs only with --whole-gpus (chart wholeGpus.enabled), and only GPUs whose MIG mode was off when it started or that it may switch (--mig-mode-switching, chart wholeGpus.switchMigMode); check `kubectl get resourceslices` for this node, then delete the pod so that its claim is allocated again"
    )]
    Unpublished,
    /// The backend's inventory could not be read.
    #[error("the node's GPUs cannot be read ({0}); the kubelet retries")]
    InventoryUnreadable(BackendError),
    /// The GPU is not in the inventory now.
    #[error(
        "GPU {index} ({uuid}) is not in this node's inventory: it does not answer or was removed; the kubelet retries, and the device is published again once the GPU answers"
    )]
    NotInInventory {
        /// The GPU's index.
        index: u32,
        /// The UUID it was published with.
        uuid: String,
    },
    /// Another GPU is at the index now.
    #[error(
        "GPU {index} now has UUID {now}, not {published} as published: the GPUs changed since the plugin started; restart the plugin so that it publishes them again"
    )]
    UuidChanged {
        /// The GPU's index.
        index: u32,
        /// Its UUID now.
        now: String,
        /// The UUID it was published with.
        published: String,
    },
    /// The GPU has MIG mode on and DAS does not switch it (`why`).
    #[error(
        "GPU {index} ({uuid}) has MIG mode on, and a whole GPU is served only with MIG mode off; DAS does not switch it ({why}): switch it off (`nvidia-smi -i {index} -mig 0`, then reset the GPU where needed) and restart the plugin, or ask for a MIG slice (DeviceClass {})",
        das_api::DEVICE_CLASS_ALL
    )]
    MigModeOn {
        /// The GPU's index.
        index: u32,
        /// Its UUID.
        uuid: String,
        /// Why DAS does not switch it.
        why: String,
    },
}

/// Why a share of a shareable device cannot be prepared ([`super::PrepareError::Share`];
/// docs/design.md §7, "Shared slices"). Claims are named `claim <namespace>/<name>`, joined
/// by `, `.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShareRefusal {
    /// The allocation has no `shareID`.
    #[error(
        "its allocation has no shareID: the scheduler allocated a shareable device without consumable capacity (DRAConsumableCapacity, on from Kubernetes 1.36); DAS publishes shareable devices only to servers that have it, so delete the pod to have its claim allocated again"
    )]
    NoShareId,
    /// A consumed capacity is no count or size.
    #[error("its consumed capacity {name} {value:?} is {error}")]
    BadCapacity {
        /// The capacity's name.
        name: String,
        /// The quantity the scheduler wrote.
        value: String,
        /// What is wrong with it.
        error: QuantityError,
    },
    /// The share's config asks for another strategy than MPS.
    #[error(
        "request {request:?} asks for sharing.strategy Exclusive, but a shareable slice is shared through MPS: every share's config must have sharing.strategy MPS (its DeviceClass {shared_class} sets it; leave the claim's config out, or ask for an exclusive slice with class {exclusive_class})"
    )]
    NotMps {
        /// The request.
        request: String,
        /// The DeviceClass of the profile's shareable MIG instances.
        shared_class: String,
        /// The DeviceClass of the profile's exclusive MIG instances.
        exclusive_class: String,
    },
    /// Claims of another namespace hold the MIG instance (docs/design.md §7, "Shares are a tenant's
    /// own").
    #[error(
        "the slice serves namespace {serves} (held by {holders}), and a shared slice serves one namespace: this claim of namespace {namespace} may not join it, so nothing was created or joined. The kubelet retries; the prepare succeeds once those claims are unprepared. For another slice now, delete the pod: its claim is allocated again, and das-webhook's selector steers it away from this slice (a claim das-webhook did not see, in a namespace it excludes or while it was down, has none: create it again where das-webhook serves). Or have the cluster's admin allow sharing across namespaces (chart value sharing.acrossNamespaces)"
    )]
    OtherNamespace {
        /// The namespaces the MIG instance serves, joined by ` and `.
        serves: String,
        /// The holding claims.
        holders: String,
        /// This claim's namespace.
        namespace: String,
    },
    /// The MIG instance's only holders are being released.
    #[error(
        "its slice's last shares ({holders}) are being released; it is created again once they are gone (the kubelet retries)"
    )]
    Releasing {
        /// The holding claims.
        holders: String,
    },
    /// The MIG instance's holders have another configuration.
    #[error(
        "the slice is shared by {holders} with another device configuration (MPS limits {theirs}), and this claim asks for {ours}: shares of one slice have the same configuration, so give this claim the same sharing settings or ask for another slice"
    )]
    OtherConfig {
        /// The holding claims.
        holders: String,
        /// Their MPS limits.
        theirs: String,
        /// This claim's.
        ours: String,
    },
    /// The MIG instance's GPU does not answer (a join).
    #[error("its slice's GPU does not answer: {0}")]
    GpuUnavailable(BackendError),
    /// The MIG instance the other shares hold is gone from the GPU (a join).
    #[error(
        "the slice its other shares hold is gone from the GPU (destroyed outside DAS, or its compute instance lost); it is created again once they are unprepared"
    )]
    Gone,
}

/// Why the MPS configs of a claim cannot be served (the `reason` of
/// [`super::PrepareError::InvalidConfig`]; docs/design.md §7, "MPS on a slice").
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MpsConfigRefusal {
    /// MPS asked for on a whole GPU held alone.
    #[error(
        "request {request:?}: device {device} is a whole GPU held alone, and DAS serves MPS on MIG slices and on shares of a GPU; to share the GPU by memory ask for DeviceClass {}, for a slice DeviceClass {} or a profile's class; or use sharing.strategy Exclusive or TimeSlicing",
        das_api::shared_whole_gpu_device_class(),
        das_api::DEVICE_CLASS_ALL
    )]
    WholeGpu {
        /// The request.
        request: String,
        /// The whole GPU allocated for it.
        device: String,
    },
    /// Several devices of the claim ask for MPS.
    #[error(
        "{} devices have sharing.strategy MPS ({}), but a claim gets one MPS slice: its containers have one CUDA_MPS_PIPE_DIRECTORY, so they could reach one slice's daemon only; ask for one device with MPS per claim",
        .devices.len(),
        .devices.join(", ")
    )]
    SeveralDevices {
        /// The devices that ask for MPS.
        devices: Vec<String>,
    },
}

/// Why the time-slicing config of a claim cannot be served (the `reason` of
/// [`super::PrepareError::InvalidConfig`]; docs/design.md §7, "Time-slicing").
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimeSliceRefusal {
    /// Time-slicing asked for on a device that is not a whole GPU.
    #[error(
        "request {request:?}: device {device} is a MIG slice, and sharing.strategy TimeSlicing applies to whole GPUs only (DeviceClass {}): a MIG slice's compute is its own; use sharing.strategy MPS to share a slice, or Exclusive",
        das_api::DEVICE_CLASS_WHOLE_GPU
    )]
    NotWholeGpu {
        /// The request.
        request: String,
        /// The device allocated for it.
        device: String,
    },
}
