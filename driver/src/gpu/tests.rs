//! Unit tests of [`super`] (`gpu/mod.rs`): capability minors and error messages.

use super::*;

#[test]
fn capability_minors_match_mig_minors_listing() {
    // docs/reference/mig.md, "Device nodes and capabilities": the listing ends with `gpu31/gi14/ci7/access 4322`.
    assert_eq!(ci_cap_minor(31, 14, 7), 4322);
    assert_eq!(gi_cap_minor(0, 0), 3);
    assert_eq!(ci_cap_minor(0, 0, 0), 4);
    assert_eq!(gi_cap_minor(1, 2), 3 + 135 + 18);
}

#[test]
fn errors_name_gpu_profile_and_placement() {
    let e = BackendError::InsufficientResources {
        target: Target::at(2, "1g.10gb", Placement { start: 6, size: 2 }),
        reason: "memory slices [6] already occupied".into(),
    };
    assert_eq!(
        e.to_string(),
        "GPU 2, profile 1g.10gb, placement 6:2: insufficient resources: memory slices [6] already occupied"
    );
    let e = BackendError::NotFound {
        target: Target {
            gi_id: Some(3),
            ..Target::gpu(0)
        },
        reason: "no such GPU instance".into(),
    };
    assert_eq!(
        e.to_string(),
        "GPU 0, GI 3: not found: no such GPU instance"
    );
    assert_eq!(e.target().gpu, 0);
}
