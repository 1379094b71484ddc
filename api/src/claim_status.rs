//! The contract between the node plugin and the controller inside a ResourceClaim: which
//! allocation results are ours, and what the plugin writes into `status.devices` once a MIG
//! instance exists, or a whole GPU is prepared (docs/design.md, "Device status" and "Whole
//! GPUs").
//!
//! The plugin writes, per prepared device, an `AllocatedDeviceStatus` with condition
//! [`CONDITION_READY`] (`True`, reason [`REASON_READY`], or [`REASON_WHOLE_GPU_READY`] for a
//! whole GPU) and [`DeviceStatusData`] as `data`;
//! the controller reads both back to mark the AllocationClaim `inUse` and to learn the MIG UUID
//! (KEP-4817, "Resource Claim Status With Possible Standardized Network Interface Data":
//! drivers own their entries of `status.devices`; `data` is driver-defined JSON).

use k8s_openapi::api::resource::v1::{
    AllocatedDeviceStatus, DeviceRequestAllocationResult, ResourceClaim,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use serde::{Deserialize, Serialize};

use crate::allocation::MigPlacement;
use crate::{DRIVER_NAME, WHOLE_GPU_PROFILE};

/// Condition type the plugin sets to `True` once the device's MIG instance exists and its CDI
/// spec is written.
pub const CONDITION_READY: &str = "Ready";
/// Reason of [`CONDITION_READY`]. The value predates the `MigInstance` naming and stays, since
/// clusters and scripts match on it.
pub const REASON_READY: &str = "SliceCreated";
/// Reason of the `Ready` condition of a prepared whole GPU (docs/design.md §7, "Whole GPUs").
pub const REASON_WHOLE_GPU_READY: &str = "GpuPrepared";
/// Binding condition of a device published for carve before bind (docs/design.md §7, "Carve
/// before bind"; KEP-5007): the node plugin sets it `True` once the slice exists, before the pod
/// is bound; the scheduler binds the pod when every binding condition is `True`.
pub const CONDITION_SLICE_READY: &str = "mig.das.com/SliceReady";
/// Binding failure condition of such a device: `True` when the slice could not be carved; the
/// scheduler then clears the allocation and schedules the pod again.
pub const CONDITION_SLICE_FAILED: &str = "mig.das.com/SliceFailed";

/// The `data` of our entry in `status.devices`: the carved MIG instance, or a whole GPU.
///
/// JSON: `{"migUUID": "MIG-…", "gpuUUID": "GPU-…", "profile": "1g.10gb",
/// "placement": {"start": 0, "size": 1}, "gpuInstanceId": 7, "computeInstanceId": 0,
/// "readyTime": "2026-11-23T06:30:00.123Z"}` (placement in memory slices; the ids and the time
/// are absent in data written by plugins before 0.3). A whole GPU ([`Self::whole_gpu`]) has the
/// same shape: `migUUID` empty, `profile` [`WHOLE_GPU_PROFILE`], placement every memory slice
/// of the GPU (`{"start": 0, "size": <memory slices>}`), no instance ids.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct DeviceStatusData {
    /// UUID of the MIG device (`MIG-…`), as NVML reports it.
    #[serde(rename = "migUUID")]
    pub mig_uuid: String,
    /// UUID of the parent GPU (`GPU-…`).
    #[serde(rename = "gpuUUID")]
    pub gpu_uuid: String,
    /// GPU-instance profile, e.g. `1g.10gb+me`.
    pub profile: String,
    /// Placement on the GPU, in memory slices.
    pub placement: MigPlacement,
    /// GPU-instance ID the driver assigned (NVML `nvmlGpuInstanceInfo_t.id`; DCGM's
    /// `GPU_I_ID` label), when known.
    #[serde(
        rename = "gpuInstanceId",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub gpu_instance_id: Option<u32>,
    /// Compute-instance ID inside the GPU instance (NVML `nvmlComputeInstanceInfo_t.id`), when
    /// known.
    #[serde(
        rename = "computeInstanceId",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub compute_instance_id: Option<u32>,
    /// When the plugin reported the device ready: RFC 3339 with milliseconds, UTC. The
    /// condition's `lastTransitionTime` says the same in whole seconds (metav1.Time), too coarse
    /// for the controller's lag metric.
    #[serde(rename = "readyTime", default, skip_serializing_if = "Option::is_none")]
    pub ready_time: Option<String>,
}

impl DeviceStatusData {
    /// The data of a prepared whole GPU `gpu_uuid` of `memory_slices` memory slices: profile
    /// [`WHOLE_GPU_PROFILE`], placement `{start: 0, size: memory_slices}` (so readers that draw
    /// placements show the whole GPU as held), no MIG UUID and no instance ids.
    pub fn whole_gpu(gpu_uuid: &str, memory_slices: i32, ready_time: Option<String>) -> Self {
        Self {
            mig_uuid: String::new(),
            gpu_uuid: gpu_uuid.to_string(),
            profile: WHOLE_GPU_PROFILE.to_string(),
            placement: MigPlacement {
                start: 0,
                size: memory_slices,
            },
            gpu_instance_id: None,
            compute_instance_id: None,
            ready_time,
        }
    }

    /// Whether this is the data of a whole GPU (profile [`WHOLE_GPU_PROFILE`]), not of a MIG
    /// instance.
    pub fn is_whole_gpu(&self) -> bool {
        self.profile == WHOLE_GPU_PROFILE
    }

    /// The reason of the [`CONDITION_READY`] condition that goes with this data:
    /// [`REASON_WHOLE_GPU_READY`] for a whole GPU, [`REASON_READY`] for a MIG instance.
    pub fn ready_reason(&self) -> &'static str {
        if self.is_whole_gpu() {
            REASON_WHOLE_GPU_READY
        } else {
            REASON_READY
        }
    }

    /// The data of `status`, if it has data in this shape (another writer's or an older
    /// plugin's data reads as `None`).
    pub fn of(status: &AllocatedDeviceStatus) -> Option<Self> {
        serde_json::from_value(status.data.as_ref()?.0.clone()).ok()
    }

    /// Our `status.devices` entry for device `device` of pool `pool` with this data and a
    /// [`CONDITION_READY`] condition (reason [`Self::ready_reason`], `message`, transition at
    /// `now`).
    pub fn ready_entry(
        &self,
        pool: &str,
        device: &str,
        message: String,
        now: Time,
    ) -> AllocatedDeviceStatus {
        AllocatedDeviceStatus {
            driver: DRIVER_NAME.to_string(),
            pool: pool.to_string(),
            device: device.to_string(),
            conditions: Some(vec![Condition {
                type_: CONDITION_READY.to_string(),
                status: "True".to_string(),
                reason: self.ready_reason().to_string(),
                message,
                last_transition_time: now,
                observed_generation: None,
            }]),
            // Serialising a struct of strings and integers cannot fail.
            data: Some(RawExtension(
                serde_json::to_value(self).expect("serialisable"),
            )),
            ..Default::default()
        }
    }
}

/// Whether `status` has condition [`CONDITION_READY`] `True`.
pub fn is_ready(status: &AllocatedDeviceStatus) -> bool {
    status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == CONDITION_READY && c.status == "True")
}

/// The server-side-apply body that sets a driver's `status.devices` `entries` on claim
/// `namespace/name` with UID `uid` (`metadata.uid` makes the API server refuse it, 409, when
/// the name now belongs to another claim).
pub fn status_devices_apply(
    name: &str,
    namespace: &str,
    uid: &str,
    entries: &[AllocatedDeviceStatus],
) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "status": {"devices": entries},
    })
}

/// Whether `status` has condition [`CONDITION_SLICE_READY`] `True`: the slice was carved before
/// the pod was bound.
pub fn is_carved(status: &AllocatedDeviceStatus) -> bool {
    status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == CONDITION_SLICE_READY && c.status == "True")
}

/// The allocation results of our driver ([`DRIVER_NAME`]) in `claim`, any pool, in allocation
/// order; empty when the claim is not allocated.
pub fn our_results(claim: &ResourceClaim) -> impl Iterator<Item = &DeviceRequestAllocationResult> {
    claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref())
        .into_iter()
        .flatten()
        .filter(|r| r.driver == DRIVER_NAME)
}

/// Our entry in `claim`'s `status.devices` for `device` of `pool`.
pub fn our_device_status<'a>(
    claim: &'a ResourceClaim,
    pool: &str,
    device: &str,
) -> Option<&'a AllocatedDeviceStatus> {
    claim
        .status
        .as_ref()?
        .devices
        .iter()
        .flatten()
        .find(|s| s.driver == DRIVER_NAME && s.pool == pool && s.device == device)
}

/// Our entry in `claim`'s `status.devices` for allocation result `r`: that of its pool and
/// device and, for a share of a shareable device (a result with a `shareID`, KEP-5075), the
/// entry with that `shareID` (a claim may hold several shares of one device, one entry each),
/// or else one without a `shareID`; for any other result the device's first entry, as
/// [`our_device_status`] finds it.
pub fn our_result_status<'a>(
    claim: &'a ResourceClaim,
    r: &DeviceRequestAllocationResult,
) -> Option<&'a AllocatedDeviceStatus> {
    let entries = || {
        claim
            .status
            .iter()
            .flat_map(|s| s.devices.iter().flatten())
            .filter(|s| s.driver == DRIVER_NAME && s.pool == r.pool && s.device == r.device)
    };
    match &r.share_id {
        Some(id) => entries()
            .find(|s| s.share_id.as_ref() == Some(id))
            .or_else(|| entries().find(|s| s.share_id.is_none())),
        None => entries().next(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::{
        AllocationResult, DeviceAllocationResult, ResourceClaimStatus,
    };

    fn data() -> DeviceStatusData {
        DeviceStatusData {
            mig_uuid: "MIG-1".into(),
            gpu_uuid: "GPU-1".into(),
            profile: "1g.10gb".into(),
            placement: MigPlacement { start: 3, size: 1 },
            gpu_instance_id: Some(9),
            compute_instance_id: Some(0),
            ready_time: Some("2023-11-14T22:13:20.125Z".into()),
        }
    }

    fn now() -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).unwrap())
    }

    #[test]
    fn the_entry_the_plugin_writes_reads_back_as_written() {
        let entry = data().ready_entry("n0", "gpu-0-mig-1g.10gb-3", "m".into(), now());
        // Through JSON, as it travels through the API server.
        let back: AllocatedDeviceStatus =
            serde_json::from_value(serde_json::to_value(&entry).unwrap()).unwrap();
        assert_eq!(DeviceStatusData::of(&back), Some(data()));
        assert!(is_ready(&back));
        let v = serde_json::to_value(&entry).unwrap();
        assert_eq!(v["data"]["migUUID"], "MIG-1");
        assert_eq!(
            v["data"]["placement"],
            serde_json::json!({"start": 3, "size": 1})
        );
        assert_eq!(v["conditions"][0]["reason"], REASON_READY);
        assert_eq!(v["data"]["gpuInstanceId"], 9);
        assert_eq!(v["data"]["readyTime"], "2023-11-14T22:13:20.125Z");
    }

    #[test]
    fn data_without_instance_ids_still_reads() {
        let old = serde_json::json!({"migUUID": "MIG-1", "gpuUUID": "GPU-1",
            "profile": "1g.10gb", "placement": {"start": 3, "size": 1}});
        let mut entry = data().ready_entry("n0", "d", "m".into(), now());
        entry.data = Some(RawExtension(old));
        let read = DeviceStatusData::of(&entry).unwrap();
        assert_eq!(read.gpu_instance_id, None);
        assert_eq!(read.mig_uuid, "MIG-1");
    }

    /// A whole GPU's entry: the same shape (an older reader still parses it), reason
    /// `GpuPrepared`, no MIG UUID and no instance ids, placement every memory slice.
    #[test]
    fn a_whole_gpu_entry_has_the_slice_shape_and_its_own_reason() {
        let data = DeviceStatusData::whole_gpu("GPU-1", 8, Some("2023-11-14T22:13:20.125Z".into()));
        assert!(data.is_whole_gpu() && !self::data().is_whole_gpu());
        let entry = data.ready_entry("n0", "gpu-0", "m".into(), now());
        let v = serde_json::to_value(&entry).unwrap();
        assert_eq!(
            v["data"],
            serde_json::json!({"migUUID": "", "gpuUUID": "GPU-1", "profile": "gpu",
                "placement": {"start": 0, "size": 8}, "readyTime": "2023-11-14T22:13:20.125Z"})
        );
        assert_eq!(v["conditions"][0]["reason"], REASON_WHOLE_GPU_READY);
        assert_eq!(v["conditions"][0]["type"], CONDITION_READY);
        let back: AllocatedDeviceStatus = serde_json::from_value(v).unwrap();
        assert!(is_ready(&back));
        assert_eq!(DeviceStatusData::of(&back), Some(data));
        let slice = self::data().ready_entry("n0", "d", "m".into(), now());
        assert_eq!(slice.conditions.unwrap()[0].reason, REASON_READY);
    }

    #[test]
    fn other_data_and_other_conditions_are_not_ours() {
        let mut entry = data().ready_entry("n0", "d", "m".into(), now());
        entry.data = Some(RawExtension(serde_json::json!({"migUUID": 7})));
        assert_eq!(DeviceStatusData::of(&entry), None);
        entry.conditions.as_mut().unwrap()[0].status = "False".into();
        assert!(!is_ready(&entry));
    }

    #[test]
    fn only_our_results_are_returned() {
        let result = |driver: &str, device: &str| DeviceRequestAllocationResult {
            driver: driver.into(),
            pool: "n0".into(),
            device: device.into(),
            request: "r".into(),
            ..Default::default()
        };
        let mut claim = ResourceClaim::default();
        assert_eq!(our_results(&claim).count(), 0);
        claim.status = Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(vec![
                        result(DRIVER_NAME, "a"),
                        result("gpu.nvidia.com", "b"),
                        result(DRIVER_NAME, "c"),
                    ]),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            devices: Some(vec![data().ready_entry("n0", "c", "m".into(), now())]),
            ..Default::default()
        });
        let names: Vec<_> = our_results(&claim).map(|r| r.device.as_str()).collect();
        assert_eq!(names, ["a", "c"]);
        assert!(our_device_status(&claim, "n0", "c").is_some());
        assert!(our_device_status(&claim, "n1", "c").is_none());
    }

    #[test]
    fn a_shares_entry_is_found_by_its_share_id() {
        let result = |share: Option<&str>| DeviceRequestAllocationResult {
            driver: DRIVER_NAME.into(),
            pool: "n0".into(),
            device: "s".into(),
            request: "r".into(),
            share_id: share.map(str::to_string),
            ..Default::default()
        };
        let entry = |share: &str, message: &str| AllocatedDeviceStatus {
            share_id: Some(share.into()),
            ..data().ready_entry("n0", "s", message.into(), now())
        };
        let message = |s: Option<&AllocatedDeviceStatus>| {
            s.and_then(|s| s.conditions.as_ref())
                .map(|c| c[0].message.clone())
        };
        let claim = ResourceClaim {
            status: Some(ResourceClaimStatus {
                devices: Some(vec![entry("id-1", "one"), entry("id-2", "two")]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let of = |r| message(our_result_status(&claim, &r));
        assert_eq!(of(result(Some("id-2"))), Some("two".into()));
        assert_eq!(of(result(Some("id-1"))), Some("one".into()));
        assert_eq!(
            of(result(None)),
            Some("one".into()),
            "no shareID: the first"
        );
        assert_eq!(
            of(result(Some("id-3"))),
            None,
            "another share's entry is not its"
        );
    }
}
