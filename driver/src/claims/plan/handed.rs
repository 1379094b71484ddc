//! What the kubelet and the container runtime get for a prepared claim (pure): the kubelet's
//! view of a record, and the CDI devices of a claim from what each of its devices holds — a live
//! MIG instance, or a whole GPU ([`Holding`]).

use std::collections::BTreeMap;

use crate::claims::cdi::SpecDevice;
use crate::claims::checkpoint::{ClaimRecord, RecordedDevice};
use crate::claims::handler::PreparedDevice;
use crate::claims::kinds::{CdiPlace, Holding, Kinds};
use crate::gpu::MigInstance;

/// What each of `devices` holds, from the live instances matched to them (same order,
/// [`super::match_devices`]): its instance for a MIG device (`None` when it has none), its GPU's
/// device node for a whole GPU (`None` when `minor` does not know the GPU: it is no longer
/// published here). Nothing is looked for on a whole GPU's GPU.
pub fn holdings(
    devices: &[RecordedDevice],
    matched: &[Option<MigInstance>],
    minor: impl Fn(&RecordedDevice) -> Option<u32>,
) -> Vec<Option<Holding>> {
    let kinds = Kinds::standard();
    devices
        .iter()
        .zip(matched)
        .map(|(d, m)| kinds.of_record(d).holding(d, m.as_ref(), minor(d)))
        .collect()
}

/// The request name the kubelet expects: without `/<subrequest>`.
pub(crate) fn base_request(request: &str) -> &str {
    request.split('/').next().unwrap_or(request)
}

/// The kubelet's view of a record: each device serves its base request and carries its CDI
/// device (records upgraded from the first release name one CDI device per request).
pub fn kubelet_devices(record: &ClaimRecord) -> Vec<PreparedDevice> {
    record
        .devices
        .iter()
        .map(|d| {
            let request = base_request(&d.request).to_string();
            let ids = record
                .cdi_device_ids
                .get(&d.device)
                .or_else(|| record.cdi_device_ids.get(&request))
                .cloned()
                .unwrap_or_default();
            PreparedDevice {
                cdi_device_ids: ids,
                requests: vec![request],
                pool: d.pool.clone(),
                device: d.device.clone(),
                share_id: d.share.as_ref().map(|s| s.id.clone()),
            }
        })
        .collect()
}

/// The CDI devices of a claim whose devices are `devices`, holding `held` (same order): one per
/// device, keyed by its name — or, for a record of the first release whose CDI device IDs were
/// per request (`legacy_keys`), one per request holding all of the request's instances, so the
/// IDs the kubelet already has keep resolving. A device's position in its request (which names
/// its `DAS_MIG_UUID_…` or `DAS_GPU_UUID_…` variable) counts the devices of every kind alike,
/// in allocation order; each device's kind writes its own edits.
pub fn spec_devices(
    devices: &[RecordedDevice],
    held: &[Holding],
    caps_major: u32,
    legacy_keys: &[String],
) -> Vec<SpecDevice> {
    let kinds = Kinds::standard();
    let mut position: BTreeMap<&str, usize> = BTreeMap::new();
    let placed: Vec<(&RecordedDevice, &Holding, CdiPlace<'_>)> = devices
        .iter()
        .zip(held)
        .map(|(d, h)| {
            let request = base_request(&d.request);
            let index = position.entry(request).or_default();
            let at = CdiPlace {
                request,
                index: *index,
                caps_major,
            };
            *index += 1;
            (d, h, at)
        })
        .collect();
    let device =
        |key: &str, of: &mut dyn Iterator<Item = &(&RecordedDevice, &Holding, CdiPlace<'_>)>| {
            let mut dev = SpecDevice {
                key: key.to_string(),
                instances: Vec::new(),
                gpus: Vec::new(),
                mps: None,
                hooks: Vec::new(),
            };
            for (d, h, at) in of {
                kinds.of_record(d).cdi_edits(d, h, *at, &mut dev);
            }
            dev
        };
    if legacy_keys.is_empty() {
        return placed
            .iter()
            .map(|p| device(&p.0.device, &mut std::iter::once(p)))
            .collect();
    }
    legacy_keys
        .iter()
        .map(|key| {
            let mut of_request = placed
                .iter()
                .filter(|(d, _, _)| base_request(&d.request) == key);
            device(key, &mut of_request)
        })
        .filter(|d| !d.instances.is_empty() || !d.gpus.is_empty())
        .collect()
}

/// The keys of a record's CDI device IDs that are request names, not device names: present only
/// in records upgraded from the first release.
pub fn legacy_cdi_keys(record: &ClaimRecord) -> Vec<String> {
    record
        .cdi_device_ids
        .keys()
        .filter(|k| !record.devices.iter().any(|d| &d.device == *k))
        .cloned()
        .collect()
}
