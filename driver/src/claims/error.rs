//! [`PrepareError`]: why a prepare or unprepare of one claim failed. Kept typed through the
//! request path (metrics are labelled by [`PrepareError::metric_label`]) and turned into the
//! kubelet's error text only at the gRPC boundary, prefixed with the claim.

use std::sync::Arc;

use das_api::DRIVER_NAME;

pub use reasons::{ModeRefusal, MpsConfigRefusal, ShareRefusal, TimeSliceRefusal, WholeGpuRefusal};

use crate::claims::cdi::CdiError;
use crate::claims::checkpoint::CheckpointError;
use crate::gpu::BackendError;

/// Why one claim could not be prepared or unprepared. Every message names the device, instance or
/// object at fault and, where there is one, what the user can do. The variants that wrap another
/// part's error keep it as their [`std::error::Error::source`] (behind an [`Arc`] where that error
/// cannot be cloned: an answer is cloned to every caller waiting for it).
#[derive(Debug, Clone, thiserror::Error)]
pub enum PrepareError {
    /// The ResourceClaim could not be read (the API server is unreachable or slow).
    #[error("cannot read the ResourceClaim from the API server: {0}")]
    ApiRead(#[source] ApiError),
    /// The ResourceClaim is gone.
    #[error("the ResourceClaim no longer exists")]
    ClaimGone,
    /// A ResourceClaim of that name exists with another UID.
    #[error("the API server has UID {found} for that name: the claim was replaced")]
    ClaimReplaced {
        /// The UID the API server has.
        found: String,
    },
    /// The claim has no allocation.
    #[error("the claim is not allocated")]
    NotAllocated,
    /// The claim's allocation has no device of this driver.
    #[error("no device of driver {DRIVER_NAME} is allocated")]
    NoDeviceOfOurs,
    /// An allocated device belongs to another node's pool.
    #[error("device {device} is in pool {pool}, which is not this node ({node})")]
    ForeignPool {
        /// Allocated device.
        device: String,
        /// Its pool.
        pool: String,
        /// This node.
        node: String,
    },
    /// A device is allocated with admin access (`adminAccess: true`), which DAS does not offer:
    /// admin access shares a device already in use, while DAS creates a MIG instance per claim.
    #[error(
        "device {device} is allocated with admin access, which DAS does not support (it creates one MIG instance per claim); request it without adminAccess"
    )]
    AdminAccess {
        /// Allocated device.
        device: String,
    },
    /// An allocated device is not one this node publishes.
    #[error("device {device} is not a device this node publishes")]
    UnknownDevice {
        /// Allocated device.
        device: String,
    },
    /// A configuration of the claim or its DeviceClass for DAS's devices is not valid
    /// (`das_api::device_config`, docs/design.md §3, "Device configuration"). Nothing was
    /// created or recorded.
    #[error(
        "the claim's device configuration for {}: {reason}",
        das_api::DRIVER_NAME
    )]
    InvalidConfig {
        /// What is wrong and what is valid, with the config's position and source.
        reason: String,
    },
    /// An allocated whole GPU cannot be prepared here (docs/design.md §7, "Whole GPUs"): this
    /// node does not publish it, its GPU is not in the inventory (lost, replaced), or the GPU has
    /// MIG mode on. Nothing was created or recorded for it.
    #[error("device {device} (a whole GPU) cannot be prepared: {reason}")]
    WholeGpuUnavailable {
        /// Allocated device, `gpu-<index>`.
        device: String,
        /// What is wrong, and what to do.
        reason: String,
    },
    /// The GPU of an allocated device is not in the MIG mode the device needs and could not be
    /// switched (docs/design.md §7, "MIG mode follows demand"): switching is off or refused for
    /// it, another claim or a MIG instance still holds it, or `nvmlDeviceSetMigMode` failed.
    /// Nothing was created; the GPU keeps its mode.
    #[error("device {device}: GPU {gpu} cannot be switched to MIG mode {}: {reason}", if *.mig_enabled { "on" } else { "off" })]
    MigModeSwitch {
        /// Allocated device.
        device: String,
        /// The GPU's index.
        gpu: u32,
        /// The mode the device needs: `true` for MIG mode on (a MIG instance), `false` for off (a
        /// whole GPU).
        mig_enabled: bool,
        /// What is wrong, and what to do.
        reason: String,
    },
    /// The MPS control daemon of a device served with MPS could not be started (or MPS is
    /// not available on this node: no control binary). The prepare is rolled back: its
    /// instances are destroyed (docs/design.md §7, "MPS on a slice").
    #[error("device {device}: the MPS control daemon of its slice could not be started: {reason}")]
    MpsDaemon {
        /// Allocated device.
        device: String,
        /// What failed, with the end of the daemon's log where it wrote one.
        reason: String,
    },
    /// The time slice a whole GPU's config asks for could not be set (docs/design.md §7,
    /// "Time-slicing"): no `nvidia-smi` on this node, the GPU refuses it, or `nvidia-smi`
    /// failed. The prepare is rolled back.
    #[error("device {device}: GPU {gpu}'s time slice could not be set: {reason}")]
    TimeSlice {
        /// Allocated device, `gpu-<index>`.
        device: String,
        /// The GPU's index.
        gpu: u32,
        /// What failed.
        reason: String,
    },
    /// A share of a shareable device cannot be prepared (docs/design.md §7, "Shared slices"):
    /// its allocation has no `shareID`, its config is not MPS, the MIG instance's other shares have
    /// another config, or they are being released. Nothing was created for it.
    #[error("device {device} (a shared slice): {reason}")]
    Share {
        /// Allocated device, `…-shared`.
        device: String,
        /// What is wrong, and what to do.
        reason: ShareRefusal,
    },
    /// Creating an instance failed.
    #[error("device {device}: {source}{hint}")]
    Create {
        /// Allocated device.
        device: String,
        /// What the backend said.
        source: BackendError,
        /// What it means for the user, when known.
        hint: &'static str,
    },
    /// A placement of the allocation overlaps a MIG instance that another claim's record still holds:
    /// the kubelet has not unprepared that claim, so a container of its pod may still run on
    /// the MIG instance (a force-deleted pod; docs/design.md, "A slice leaves its claim"). DAS never
    /// destroys it for the new claim; the kubelet retries this prepare, which succeeds once the
    /// kubelet has unprepared the holder.
    #[error(
        "device {device} overlaps a MIG slice still prepared for {}: the kubelet has not unprepared it, so a container of its pod may still run there (a force-deleted pod whose containers are stopping); DAS never hands a slice on while that can be, and the kubelet retries this prepare until the holder is unprepared",
        holders.join(", ")
    )]
    PlacementHeld {
        /// Allocated device whose placement is held.
        device: String,
        /// The holding claims, as `namespace/name (UID)`.
        holders: Vec<String>,
    },
    /// MIG instances that must go could not be destroyed; they stay recorded and the reaper retries.
    #[error("{}", describe_destroys(failures, *only_lost_gpus))]
    Destroy {
        /// One message per instance, naming it and the cause.
        failures: Vec<String>,
        /// Every failing instance sits on a lost GPU.
        only_lost_gpus: bool,
    },
    /// A recorded instance cannot be checked because its GPU does not answer.
    #[error("{0}")]
    GpuUnavailable(BackendError),
    /// The CDI spec could not be built, written or deleted.
    #[error("CDI spec: {0}")]
    Cdi(#[source] Arc<CdiError>),
    /// The checkpoint could not be saved.
    #[error("checkpoint: {0}")]
    Checkpoint(#[source] Arc<CheckpointError>),
    /// This plugin instance handed the node to a newer one.
    #[error(
        "this DAS node plugin instance has handed over to a newer one on the node; the kubelet retries"
    )]
    HandedOver,
    /// A task of the plugin failed (a bug).
    #[error("internal error: {0}")]
    Internal(String),
}

fn describe_destroys(failures: &[String], only_lost: bool) -> String {
    let what = if only_lost {
        "slices on a lost GPU could not be destroyed; they stay recorded and are destroyed when the GPU answers again"
    } else {
        "slices could not be destroyed; they stay recorded and the plugin retries"
    };
    format!("{what}: {}", failures.join("; "))
}

impl PrepareError {
    /// A short, stable name of the cause, for the `cause` label of metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            PrepareError::ApiRead(_) => "api_read",
            PrepareError::ClaimGone => "claim_gone",
            PrepareError::ClaimReplaced { .. } => "claim_replaced",
            PrepareError::NotAllocated => "not_allocated",
            PrepareError::NoDeviceOfOurs => "no_device_of_ours",
            PrepareError::ForeignPool { .. } => "foreign_pool",
            PrepareError::UnknownDevice { .. } => "unknown_device",
            PrepareError::AdminAccess { .. } => "admin_access",
            PrepareError::InvalidConfig { .. } => "invalid_config",
            PrepareError::WholeGpuUnavailable { .. } => "whole_gpu_unavailable",
            PrepareError::MigModeSwitch { .. } => "mig_mode_switch",
            PrepareError::MpsDaemon { .. } => "mps_daemon",
            PrepareError::TimeSlice { .. } => "time_slice",
            PrepareError::Share { .. } => "share",
            PrepareError::Create { .. } => "create",
            PrepareError::PlacementHeld { .. } => "placement_held",
            PrepareError::Destroy { .. } => "destroy",
            PrepareError::GpuUnavailable(_) => "gpu_unavailable",
            PrepareError::Cdi(_) => "cdi",
            PrepareError::Checkpoint(_) => "checkpoint",
            PrepareError::HandedOver => "handed_over",
            PrepareError::Internal(_) => "internal",
        }
    }

    /// A create failure, with what an occupied placement means for the user.
    pub fn create(device: &str, source: BackendError) -> Self {
        let hint = match source {
            BackendError::InsufficientResources { .. } => {
                " (the placement is taken on the GPU: a slice DAS did not create, or one not yet destroyed)"
            }
            _ => "",
        };
        PrepareError::Create {
            device: device.to_string(),
            source,
            hint,
        }
    }
}

mod reasons;

impl From<CdiError> for PrepareError {
    fn from(e: CdiError) -> Self {
        PrepareError::Cdi(Arc::new(e))
    }
}

impl From<CheckpointError> for PrepareError {
    fn from(e: CheckpointError) -> Self {
        PrepareError::Checkpoint(Arc::new(e))
    }
}

/// A failed API call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    /// What went wrong, for messages.
    pub message: String,
    /// Retrying cannot help: the object is gone, or the write is refused for good (for example
    /// the claim was replaced or deallocated, so the status no longer fits it).
    pub permanent: bool,
}

impl ApiError {
    /// A failure worth retrying.
    pub(crate) fn transient(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            permanent: false,
        }
    }

    /// A failure retrying cannot fix.
    pub fn permanent(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            permanent: true,
        }
    }
}

impl From<kube::Error> for ApiError {
    fn from(e: kube::Error) -> Self {
        // 404 gone, 409 conflict (UID precondition), 422 invalid (devices no longer allocated).
        let permanent = matches!(&e, kube::Error::Api(s) if [404, 409, 422].contains(&s.code));
        Self {
            message: e.to_string(),
            permanent,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::{Placement, Target};

    #[test]
    fn messages_name_the_device_and_the_cause() {
        let e = PrepareError::create(
            "gpu-0-mig-1g-10gb-6",
            BackendError::InsufficientResources {
                target: Target::at(0, "1g.10gb", Placement { start: 6, size: 1 }),
                reason: "memory slices [6] already occupied".into(),
            },
        );
        let text = e.to_string();
        assert!(
            text.starts_with("device gpu-0-mig-1g-10gb-6: GPU 0"),
            "{text}"
        );
        assert!(text.contains("not yet destroyed"), "{text}");
        assert_eq!(e.metric_label(), "create");
        let e = PrepareError::Destroy {
            failures: vec!["slice MIG-x: in use".into()],
            only_lost_gpus: false,
        };
        assert!(
            e.to_string().contains("the plugin retries: slice MIG-x"),
            "{e}"
        );
        assert!(PrepareError::HandedOver.to_string().contains("handed over"));
    }
}
