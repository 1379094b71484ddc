//! Carve before bind (issue 34; KEP-5007 binding conditions), what is published (pure): with
//! `--carve-before-bind` on a server that serves binding conditions, every MIG device (exclusive
//! and shareable) lists [`SLICE_READY`] as its binding condition and [`SLICE_FAILED`] as its
//! binding failure condition. The scheduler copies them into the allocation and waits in PreBind
//! until the node plugin has carved the slice and set [`SLICE_READY`] True in the claim's
//! `status.devices` (or clears the allocation when it sets [`SLICE_FAILED`]). Whole GPUs get
//! none: nothing is carved for them.

use das_api::attributes as attr;
use k8s_openapi::api::resource::v1::{Device, ResourceSliceSpec};

use super::resource_slices::{DesiredResourceSlice, ServerVersion};

/// The binding condition of a MIG device: the plugin carved its slice
/// ([`das_api::claim_status::CONDITION_SLICE_READY`], which the controller reads too).
pub const SLICE_READY: &str = das_api::claim_status::CONDITION_SLICE_READY;
/// The binding failure condition of a MIG device: the plugin could not carve its slice.
pub const SLICE_FAILED: &str = das_api::claim_status::CONDITION_SLICE_FAILED;

/// Whether a server of `version` may be given devices with binding conditions: 1.36 and newer
/// (`DRADeviceBindingConditions` beta and on). On 1.34–1.35 the gate is alpha and off: the API
/// server drops the fields, and a scheduler with the gate off treats such devices as
/// unselectable.
///
/// # Errors
/// Why not, for the log.
pub fn binding_supported(version: ServerVersion) -> Result<(), String> {
    match (version.major, version.minor) {
        (1, m) if m >= 36 => Ok(()),
        (1, m @ (34 | 35)) => Err(format!(
            "Kubernetes 1.{m} has binding conditions (DRADeviceBindingConditions) alpha and off: its scheduler would treat devices with binding conditions as unselectable; carve before bind needs 1.36 or newer"
        )),
        (major, minor) => Err(format!(
            "Kubernetes {major}.{minor} is not supported for carve before bind; it needs 1.36 or newer"
        )),
    }
}

/// `desired` with the binding conditions of carve before bind on every MIG device.
pub fn with_binding_conditions(
    mut desired: Vec<DesiredResourceSlice>,
) -> Vec<DesiredResourceSlice> {
    for s in &mut desired {
        for d in s.slice.spec.devices.iter_mut().flatten() {
            if is_mig(d) {
                d.binding_conditions = Some(vec![SLICE_READY.to_string()]);
                d.binding_failure_conditions = Some(vec![SLICE_FAILED.to_string()]);
            }
        }
    }
    desired
}

/// Whether `d` is a MIG device (exclusive or shareable), not a whole GPU.
fn is_mig(d: &Device) -> bool {
    let kind = d
        .attributes
        .as_ref()
        .and_then(|a| a.get(attr::TYPE))
        .and_then(|t| t.string.as_deref());
    matches!(kind, Some(attr::TYPE_MIG | attr::TYPE_MIG_SHARED))
}

/// A device `d` without binding conditions (what is published once the server was seen
/// dropping them).
pub fn without_binding_conditions(d: &mut Device) {
    d.binding_conditions = None;
    d.binding_failure_conditions = None;
}

/// `specs` without any binding conditions (the publisher's, once the server was seen dropping
/// them).
pub fn strip_binding_conditions(mut specs: Vec<ResourceSliceSpec>) -> Vec<ResourceSliceSpec> {
    for d in specs
        .iter_mut()
        .flat_map(|s| s.devices.iter_mut().flatten())
    {
        without_binding_conditions(d);
    }
    specs
}

#[cfg(test)]
mod tests;
