//! What is published while the API server drops binding conditions (pure; KEP-5007): the
//! devices without them.

use k8s_openapi::api::resource::v1::{Device, ResourceSliceSpec};

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
