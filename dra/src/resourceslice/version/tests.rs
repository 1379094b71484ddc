//! Unit tests of [`super`] (`version.rs`).

use super::*;

fn v(major: u32, minor: u32, patch: u32) -> ServerVersion {
    ServerVersion {
        major,
        minor,
        patch,
    }
}

#[test]
fn the_version_is_read_from_git_version_else_from_major_and_minor() {
    let info = |git: &str, major: &str, minor: &str| Info {
        git_version: git.into(),
        major: major.into(),
        minor: minor.into(),
        ..Default::default()
    };
    assert_eq!(
        ServerVersion::from_info(&info("v1.37.2", "1", "37")),
        v(1, 37, 2)
    );
    assert_eq!(
        ServerVersion::from_info(&info("v1.36.2-rc.0+k3s1", "1", "36+")),
        v(1, 36, 2)
    );
    assert_eq!(ServerVersion::from_info(&info("", "1", "35+")), v(1, 35, 0));
    assert_eq!(ServerVersion::from_info(&info("", "x", "")), v(0, 0, 0));
}

#[test]
fn binding_conditions_need_kubernetes_1_36() {
    assert_eq!(v(1, 36, 0).binding_conditions(), Ok(()));
    assert_eq!(v(1, 37, 1).binding_conditions(), Ok(()));
    let e = v(1, 35, 4).binding_conditions().unwrap_err();
    assert_eq!(e, Unsupported::BindingConditionsAlpha { minor: 35 });
    let text = e.to_string();
    assert!(
        text.contains("DRADeviceBindingConditions") && text.contains("1.36 or newer"),
        "{text}"
    );
    assert!(v(1, 34, 0).binding_conditions().is_err());
    let e = v(2, 0, 0).binding_conditions().unwrap_err().to_string();
    assert_eq!(
        e,
        "Kubernetes 2.0 is not supported for binding conditions; they need 1.36 or newer"
    );
}

#[test]
fn shareable_devices_need_a_scheduler_that_counts_them() {
    assert_eq!(v(1, 37, 0).shareable_devices(), Ok(()));
    assert_eq!(v(1, 38, 1).shareable_devices(), Ok(()));
    assert_eq!(v(1, 36, 2).shareable_devices(), Ok(()));
    let e = v(1, 36, 1).shareable_devices().unwrap_err();
    assert_eq!(e, Unsupported::SharesRecount { patch: 1 });
    let text = e.to_string();
    assert!(
        text.contains("#139034") && text.contains("1.36.2"),
        "{text}"
    );
    for m in [34, 35] {
        let e = v(1, m, 9).shareable_devices().unwrap_err().to_string();
        assert!(e.contains("alpha and off") && e.contains("1.36.2"), "{e}");
    }
    assert!(matches!(
        v(1, 33, 0).shareable_devices(),
        Err(Unsupported::Unknown { minor: 33, .. })
    ));
}
