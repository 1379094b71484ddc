//! Carve before bind (issue 34; KEP-5007 binding conditions), what is published (pure): with
//! `--carve-before-bind` on a server that serves binding conditions, every MIG device (exclusive
//! and shareable) lists [`SLICE_READY`] as its binding condition and [`SLICE_FAILED`] as its
//! binding failure condition. The scheduler copies them into the allocation and waits in PreBind
//! until the node plugin has carved the slice and set [`SLICE_READY`] True in the claim's
//! `status.devices` (or clears the allocation when it sets [`SLICE_FAILED`]). Whole GPUs get
//! none: nothing is carved for them.

use das_api::attributes as attr;
use k8s_openapi::api::resource::v1::Device;

use super::resource_slices::{DesiredResourceSlice, ServerVersion};
pub use dra_plugin::resourceslice::gates::{strip_binding_conditions, without_binding_conditions};

/// The binding condition of a MIG device: the plugin carved its slice
/// ([`das_api::claim_status::CONDITION_SLICE_READY`], which the controller reads too).
pub const SLICE_READY: &str = das_api::claim_status::CONDITION_SLICE_READY;
/// The binding failure condition of a MIG device: the plugin could not carve its slice.
pub const SLICE_FAILED: &str = das_api::claim_status::CONDITION_SLICE_FAILED;

/// Whether a server of `version` may be given devices with binding conditions, so carve before
/// bind can be on: 1.36 and newer (`DRADeviceBindingConditions` beta and on;
/// [`ServerVersion::binding_conditions`]). On 1.34–1.35 the gate is alpha and off: the API
/// server drops the fields, and a scheduler with the gate off treats such devices as
/// unselectable.
///
/// # Errors
/// Why not, for the log.
pub fn binding_supported(version: ServerVersion) -> Result<(), String> {
    version.binding_conditions().map_err(|e| e.to_string())
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

#[cfg(test)]
mod tests;
