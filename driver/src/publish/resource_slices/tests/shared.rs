//! Shareable devices (docs/design.md §7, "Shared slices"; KEP-5075 consumable capacity): their
//! shape, request policies and counters, and the Kubernetes versions that may get them.

use super::*;

fn policy_of<'a>(d: &'a Device, name: &str) -> (&'a str, String, String, String) {
    let c = &d.capacity.as_ref().unwrap()[name];
    let p = c.request_policy.as_ref().unwrap();
    let r = p.valid_range.as_ref().unwrap();
    assert!(r.max.is_none() && p.valid_values.is_none(), "{name}");
    (
        c.value.0.as_str(),
        p.default.as_ref().unwrap().0.clone(),
        r.min.0.clone(),
        r.step.as_ref().unwrap().0.clone(),
    )
}

#[test]
fn a_shareable_device_is_the_placement_with_consumable_shares_and_memory() {
    let g = gpu(0, "H100-80GB");
    let (_, p) = g.model.profile("1g.10gb").unwrap();
    let exclusive = device(&g, p, 6);
    let d = shared_device(&g, p, 6, SharePolicy::default());
    assert_eq!(d.name, "gpu-0-mig-1g-10gb-6-shared");
    assert_eq!(d.allow_multiple_allocations, Some(true));
    let attrs = d.attributes.as_ref().unwrap();
    assert_eq!(attrs["type"].string.as_deref(), Some("mig-shared"));
    assert_eq!(attrs["profile"].string.as_deref(), Some("1g.10gb"));
    assert_eq!(attrs["placementStart"].int, Some(6));
    // Only capacities with a policy: one without would be consumed whole by every share.
    let caps: Vec<&String> = d.capacity.as_ref().unwrap().keys().collect();
    assert_eq!(caps, ["memory", "shares"]);
    assert_eq!(
        policy_of(&d, "shares"),
        ("4", "1".into(), "1".into(), "1".into())
    );
    // 1g.10gb is 9984 MiB: an equal quarter is 2496 MiB, rounded down to 256 MiB steps: 2304.
    assert_eq!(
        policy_of(&d, "memory"),
        ("9984Mi", "2304Mi".into(), "256Mi".into(), "256Mi".into())
    );
    // The same counters as the exclusive device: exclusive and shared use exclude each other.
    assert_eq!(consumed(&d), consumed(&exclusive));
}

#[test]
fn defaults_are_never_zero() {
    let g = gpu(0, "H100-80GB");
    let (_, p) = g.model.profile("1g.10gb").unwrap();
    // More shares than steps of memory: the default stays one step, not 0.
    let many = SharePolicy {
        shares: 100,
        memory_step_bytes: 1 << 30,
        ..SharePolicy::default()
    };
    let d = shared_device(&g, p, 0, many);
    assert_eq!(policy_of(&d, "memory").1, "1Gi");
    assert_eq!(policy_of(&d, "shares").0, "100");
}

#[test]
fn shares_need_a_scheduler_that_counts_them() {
    assert_eq!(shares_supported(1, 37, 0), Ok(()));
    assert_eq!(shares_supported(1, 38, 1), Ok(()));
    assert_eq!(shares_supported(1, 36, 2), Ok(()));
    let e = shares_supported(1, 36, 1).unwrap_err();
    assert!(e.contains("#139034") && e.contains("1.36.2"), "{e}");
    for m in [34, 35] {
        let e = shares_supported(1, m, 9).unwrap_err();
        assert!(e.contains("alpha and off") && e.contains("1.36.2"), "{e}");
    }
    assert!(shares_supported(2, 0, 0).is_err());
}

fn shared(selectors: &[&str]) -> SliceOptions {
    SliceOptions {
        layout: ResourceSliceLayout::SeparateCounterSlices,
        shared: SharedProfiles {
            selectors: selectors.iter().map(|s| s.to_string()).collect(),
            policy: SharePolicy::default(),
            ..Default::default()
        },
    }
}

#[test]
fn listed_profiles_get_a_shareable_device_per_placement_after_the_exclusive_ones() {
    let g = gpu(0, "H100-80GB");
    let plain = desired_resource_slices("n", std::slice::from_ref(&g), shared(&[])).unwrap();
    let names = |slices: &[DesiredResourceSlice]| -> Vec<String> {
        all_devices(slices).iter().map(|d| d.name.clone()).collect()
    };
    assert!(!names(&plain).iter().any(|n| n.ends_with("-shared")));
    let one = desired_resource_slices("n", std::slice::from_ref(&g), shared(&["1g.10gb"])).unwrap();
    let all = names(&one);
    // The exclusive devices first, unchanged; then the shareable ones in the same order.
    assert_eq!(&all[..names(&plain).len()], &names(&plain)[..]);
    let exclusive_order: Vec<String> = names(&plain)
        .into_iter()
        .filter(|n| n.starts_with("gpu-0-mig-1g-10gb-") && !n.contains("-me-"))
        .map(|n| format!("{n}-shared"))
        .collect();
    let shared_names: Vec<String> = all[names(&plain).len()..].to_vec();
    assert_eq!(shared_names, exclusive_order);
    assert_eq!(shared_names.len(), 7);
    // A compute size selects every profile of that size: 1g.10gb, 1g.10gb+me and 1g.20gb.
    let sized = desired_resource_slices("n", std::slice::from_ref(&g), shared(&["1g"])).unwrap();
    let n = names(&sized)
        .iter()
        .filter(|n| n.ends_with("-shared"))
        .count();
    assert_eq!(n, 7 + 7 + 4);
    // A layout converts to options that share nothing.
    let from_layout: SliceOptions = ResourceSliceLayout::SeparateCounterSlices.into();
    assert_eq!(from_layout.shared, SharedProfiles::default());
}

#[test]
fn server_versions_come_from_git_version_and_decide_what_is_shared() {
    use k8s_openapi::apimachinery::pkg::version::Info;
    let info = |git: &str, major: &str, minor: &str| Info {
        git_version: git.into(),
        major: major.into(),
        minor: minor.into(),
        ..Default::default()
    };
    let v = |major, minor, patch| ServerVersion {
        major,
        minor,
        patch,
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
    let listed = SharedProfiles {
        selectors: vec!["1g".into()],
        policy: SharePolicy::default(),
        ..Default::default()
    };
    let (o, why) = SliceOptions::for_server(v(1, 37, 0), listed.clone());
    assert_eq!((o.shared, why), (listed.clone(), None));
    let (o, why) = SliceOptions::for_server(v(1, 35, 4), listed);
    assert_eq!(o.layout, ResourceSliceLayout::SeparateCounterSlices);
    assert_eq!(o.shared, SharedProfiles::default());
    assert!(why.unwrap().contains("1.36.2"));
    let (o, why) = SliceOptions::for_server(v(1, 34, 1), SharedProfiles::default());
    assert_eq!(
        (o.layout, why),
        (ResourceSliceLayout::CountersWithDevices, None)
    );
}

/// With `gpu` among the shared profiles, every GPU served whole also gets its shareable device:
/// the whole GPU's attributes with `type: gpu-shared` and who enforces a share's memory, the
/// GPU's memory cut into shares, and every counter of the GPU, as the whole GPU consumes them.
#[test]
fn a_shared_whole_gpu_is_the_gpu_with_consumable_shares_and_memory() {
    let l4 = gpu(0, "L4");
    let h100 = GpuInfo {
        mig_enabled: false,
        ..gpu(1, "H100-80GB")
    };
    let mut options = shared(&["gpu"]);
    options.shared.memory_enforced = [l4.uuid.clone()].into();
    let slices = desired_resource_slices("n", &[l4.clone(), h100.clone()], options).unwrap();
    for (g, level) in [(&l4, "enforced"), (&h100, "mps")] {
        let whole = find(&slices, &format!("gpu-{}", g.index));
        let d = find(&slices, &format!("gpu-{}-shared", g.index));
        assert_eq!(d.allow_multiple_allocations, Some(true));
        let attrs = d.attributes.as_ref().unwrap();
        assert_eq!(attrs["type"].string.as_deref(), Some("gpu-shared"));
        assert_eq!(attrs["memoryEnforcement"].string.as_deref(), Some(level));
        assert_eq!(attrs["uuid"].string.as_deref(), Some(g.uuid.as_str()));
        // The whole GPU's memory, cut like a shared slice's: a quarter by default, 256Mi steps.
        let memory = &whole.capacity.as_ref().unwrap()["memory"].value.0;
        let (value, default, min, step) = policy_of(d, "memory");
        assert_eq!(
            (value, min.as_str(), step.as_str()),
            (memory.as_str(), "256Mi", "256Mi")
        );
        let quarter = (g.whole_gpu_memory_bytes() / 4) >> 20;
        assert_eq!(default, format!("{}Mi", quarter / 256 * 256), "{}", g.index);
        assert_eq!(
            policy_of(d, "shares"),
            ("4", "1".into(), "1".into(), "1".into())
        );
        // Every counter of its GPU: MIG use, whole use and shares of one GPU exclude each other.
        assert_eq!(consumed(d), consumed(whole));
    }
    // Not listed: no shareable whole GPU.
    let none = desired_resource_slices("n", &[l4], shared(&["1g"])).unwrap();
    assert!(all_devices(&none).iter().all(|d| d.name != "gpu-0-shared"));
}
