//! The Helm chart's shared slices (docs/design.md §7, "Shared slices"), rendered without a
//! cluster: `sharing.profiles` renders one DeviceClass `<profile>.shared.mig.das.com` per profile
//! of `deviceClasses.profiles` it names (a compute size names every profile of that size), whose
//! class config decodes as DAS's device configuration with the MPS strategy, and sets the node
//! plugin's `DAS_SHARED_PROFILES` and `DAS_SHARES_PER_SLICE`; nothing is shared by default, and
//! bad values are refused with what is valid.

use das_api::device_config::{self, SharingStrategy};
use das_api::{DRIVER_NAME, shared_profile_device_class};
use das_e2e::chart::{self, RenderOptions, Rendered, env_of};
use serde_json::Value;

fn shared_classes(r: &Rendered) -> Vec<&Value> {
    r.of_kind("DeviceClass")
        .filter(|c| {
            c["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.ends_with(&format!(".shared.{DRIVER_NAME}")))
        })
        .collect()
}

#[test]
fn nothing_is_shared_by_default() {
    let d = Rendered::new(&RenderOptions::default()).unwrap();
    assert!(shared_classes(&d).is_empty());
    let plugin = d.container("DaemonSet", "das-kubelet-plugin").unwrap();
    assert_eq!(env_of(plugin, "DAS_SHARED_PROFILES"), None);
    assert_eq!(env_of(plugin, "DAS_SHARES_PER_SLICE"), None);
}

#[test]
fn shared_profiles_render_their_classes_and_the_plugin_flags() {
    let opts = RenderOptions::default()
        .set("sharing.profiles={1g,1g.10gb,2g.20gb}")
        .set("sharing.sharesPerSlice=8");
    chart::lint(&opts).unwrap_or_else(|e| panic!("helm lint: {e:#}"));
    let r = Rendered::new(&opts).unwrap();
    let plugin = r.container("DaemonSet", "das-kubelet-plugin").unwrap();
    assert_eq!(
        env_of(plugin, "DAS_SHARED_PROFILES").as_deref(),
        Some("1g,1g.10gb,2g.20gb")
    );
    assert_eq!(env_of(plugin, "DAS_SHARES_PER_SLICE").as_deref(), Some("8"));

    // `1g`: every 1g profile the chart knows (18), once even when also named; and 2g.20gb.
    let classes = shared_classes(&r);
    assert_eq!(classes.len(), 18 + 1);
    for profile in ["1g.10gb", "1g.10gb+me", "1g.24gb-me", "1g.5gb", "2g.20gb"] {
        let name = shared_profile_device_class(profile);
        let class = r.get("DeviceClass", &name).unwrap();
        assert_eq!(
            class["spec"]["selectors"][0]["cel"]["expression"],
            format!(
                "device.driver == 'mig.das.com' && device.attributes['mig.das.com'].type == \
                 'mig-shared' && device.attributes['mig.das.com'].profile == '{profile}'"
            ),
            "{name}"
        );
        // The class config makes every share an MPS client; it decodes as the driver does.
        let config = &class["spec"]["config"];
        assert_eq!(config.as_array().map(Vec::len), Some(1), "{name}");
        assert_eq!(config[0]["opaque"]["driver"], DRIVER_NAME);
        let decoded = device_config::decode(&config[0]["opaque"]["parameters"])
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(decoded.sharing.unwrap().strategy, SharingStrategy::Mps);
    }
    assert!(
        r.find("DeviceClass", &shared_profile_device_class("2g.10gb"))
            .is_none()
    );
    // The exclusive classes are unchanged: 55 by default, besides the shared ones.
    assert_eq!(r.of_kind("DeviceClass").count(), 55 + 19);
}

#[test]
fn bad_sharing_values_are_rejected_with_what_is_valid() {
    let err = |set: &str| {
        chart::render_yaml(&RenderOptions::default().set(set))
            .unwrap_err()
            .to_string()
    };
    let e = err("sharing.profiles={5g}");
    assert!(
        e.contains("\"5g\" names no profile of deviceClasses.profiles") && e.contains("1g.10gb"),
        "{e}"
    );
    let e = err("sharing.profiles={all}");
    assert!(
        e.contains("/sharing/profiles/0") && e.contains("does not match pattern"),
        "{e}"
    );
    for bad in ["0", "65"] {
        let e = err(&format!("sharing.sharesPerSlice={bad}"));
        assert!(e.contains("/sharing/sharesPerSlice"), "{e}");
    }
    // A profile the chart renders no class for cannot be shared through the chart either.
    let minimal = RenderOptions::with_values(chart::ci_values("minimal-values.yaml"))
        .set("sharing.profiles={1g}");
    let e = chart::render_yaml(&minimal).unwrap_err().to_string();
    assert!(e.contains("names no profile"), "{e}");
}
