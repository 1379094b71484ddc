//! What a MIG slice gives a container (docs/design.md §7, "CDI"): the parent GPU's device node,
//! the GI and CI capability nodes and its MIG UUID.

use crate::claims::cdi::PreparedInstance;
use crate::claims::kinds::CdiPlace;
use crate::gpu::MigInstance;

/// The CDI part of live instance `s` at `at` in its claim's spec.
pub(super) fn prepared_instance(s: &MigInstance, at: CdiPlace<'_>) -> PreparedInstance {
    PreparedInstance {
        mig_uuid: s.mig_uuid.clone(),
        parent_minor: s.gpu_minor,
        gi_cap_minor: s.gi_cap_minor,
        ci_cap_minor: s.ci_cap_minor,
        caps_major: at.caps_major,
        caps_file_mode: Some(0o444),
        request: at.request.to_string(),
        index: at.index,
    }
}
