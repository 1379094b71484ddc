//! Version 1 of the checkpoint document (the first release), read only to upgrade it: the
//! instance fields were flat on the device, CDI device IDs were per request, and there was no
//! `Releasing` state (see [`super`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Checkpoint, ClaimRecord, DeviceKind, InstanceId, PrepareState, RecordedDevice};

/// A version-1 device: the instance fields are flat and each optional.
#[derive(Serialize, Deserialize, Clone)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(in crate::claims::checkpoint) struct DeviceV1 {
    request: String,
    pool: String,
    device: String,
    gpu_index: u32,
    #[serde(rename = "gpuUUID")]
    gpu_uuid: String,
    profile: String,
    placement_start: u32,
    placement_size: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gi_id: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ci_id: Option<u32>,
    #[serde(default, rename = "migUUID", skip_serializing_if = "Option::is_none")]
    mig_uuid: Option<String>,
}

/// Version 1 had only the two prepare states.
#[derive(Serialize, Deserialize, Clone, Copy)]
pub(in crate::claims::checkpoint) enum State {
    PrepareStarted,
    PrepareCompleted,
}

#[derive(Serialize, Deserialize, Clone)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(in crate::claims::checkpoint) struct ClaimRecordV1 {
    namespace: String,
    name: String,
    state: State,
    devices: Vec<DeviceV1>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    cdi_device_ids: BTreeMap<String, Vec<String>>,
    updated_at: u64,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(in crate::claims::checkpoint) struct Document {
    pub(in crate::claims::checkpoint) version: u64,
    pub(in crate::claims::checkpoint) boot_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(in crate::claims::checkpoint) checksum: Option<String>,
    pub(in crate::claims::checkpoint) claims: BTreeMap<String, ClaimRecordV1>,
}

impl Document {
    /// The version-1 checksum: the same rule as version 2, over the version-1 document.
    pub(in crate::claims::checkpoint) fn compute_checksum(
        &self,
    ) -> Result<String, serde_json::Error> {
        let unsummed = Document {
            version: self.version,
            boot_id: self.boot_id.clone(),
            checksum: None,
            claims: self.claims.clone(),
        };
        let bytes = serde_json::to_vec(&unsummed)?;
        Ok(format!("crc32:{:08x}", crc32fast::hash(&bytes)))
    }

    /// The same records in version 2: an instance is known when all three of its fields
    /// were. CDI device IDs were per request: a completed record's spec is written again,
    /// per device, by the next prepare retry or start-up (they check it), so the old IDs are
    /// kept as they are until then.
    pub(in crate::claims::checkpoint) fn upgrade(self) -> Checkpoint {
        let claims = self
            .claims
            .into_iter()
            .map(|(uid, r)| {
                let devices = r
                    .devices
                    .into_iter()
                    .map(|d| RecordedDevice {
                        time_slice: None,
                        acquired: false,
                        // The first release knew exclusive MIG devices only.
                        kind: DeviceKind::Mig,
                        mps: None,
                        share: None,
                        instance: match (d.gi_id, d.ci_id, d.mig_uuid) {
                            (Some(gi_id), Some(ci_id), Some(mig_uuid)) => Some(InstanceId {
                                gi_id,
                                ci_id,
                                mig_uuid,
                            }),
                            _ => None,
                        },
                        request: d.request,
                        pool: d.pool,
                        device: d.device,
                        gpu_index: d.gpu_index,
                        gpu_uuid: d.gpu_uuid,
                        profile: d.profile,
                        placement_start: d.placement_start,
                        placement_size: d.placement_size,
                    })
                    .collect();
                let state = match r.state {
                    State::PrepareStarted => PrepareState::PrepareStarted,
                    State::PrepareCompleted => PrepareState::PrepareCompleted,
                };
                let record = ClaimRecord {
                    namespace: r.namespace,
                    name: r.name,
                    state,
                    devices,
                    cdi_device_ids: r.cdi_device_ids,
                    pods: Vec::new(),
                    handed_to_kubelet: false,
                    updated_at: r.updated_at,
                };
                (uid, record)
            })
            .collect();
        Checkpoint {
            boot_id: self.boot_id,
            claims,
            mig_mode_switches: BTreeMap::new(),
        }
    }
}
