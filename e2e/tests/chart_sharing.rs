//! The Helm chart's shared slices (docs/design.md §7, "Shared slices"), rendered without a
//! cluster: `sharing.profiles` renders one DeviceClass `<profile>.shared.mig.das.com` per profile
//! of `deviceClasses.profiles` it names (a compute size names every profile of that size), whose
//! class config decodes as DAS's device configuration with the MPS strategy, and sets the node
//! plugin's `DAS_SHARED_PROFILES` and `DAS_SHARES_PER_SLICE`; nothing is shared by default, and
//! bad values are refused with what is valid. A shared slice serves one namespace (docs/design.md
//! §7, "Shares are a tenant's own"): the MutatingWebhookConfiguration sends claims for a shared
//! class to das-webhook for the namespace selector, unless `sharing.acrossNamespaces` sets both
//! programs' `--shares-across-namespaces` instead.

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

/// The webhook of the MutatingWebhookConfiguration that gives claims for a shared class their
/// namespace selector, if rendered.
fn shared_claims_hook(r: &Rendered) -> Option<Value> {
    let cfg = r.get("MutatingWebhookConfiguration", "das-webhook").ok()?;
    cfg["webhooks"]
        .as_array()?
        .iter()
        .find(|h| h["name"] == "shared-claims.mig.das.com")
        .cloned()
}

#[test]
fn nothing_is_shared_by_default() {
    let d = Rendered::new(&RenderOptions::default()).unwrap();
    assert!(shared_classes(&d).is_empty());
    let plugin = d.container("DaemonSet", "das-kubelet-plugin").unwrap();
    assert_eq!(env_of(plugin, "DAS_SHARED_PROFILES"), None);
    assert_eq!(env_of(plugin, "DAS_SHARES_PER_SLICE"), None);
    assert_eq!(env_of(plugin, "DAS_SHARES_ACROSS_NAMESPACES"), None);
    assert!(
        shared_claims_hook(&d).is_none(),
        "a claim hook with nothing shared"
    );
}

#[test]
fn claims_for_a_shared_class_are_sent_for_the_namespace_selector() {
    let opts = RenderOptions::default()
        .set("sharing.profiles={1g}")
        .set("webhook.failurePolicy=Ignore");
    let r = Rendered::new(&opts).unwrap();
    let hook = shared_claims_hook(&r).expect("the shared-claims webhook");
    assert_eq!(
        hook["clientConfig"]["service"]["path"],
        "/mutate-resource-claims"
    );
    assert_eq!(hook["rules"][0]["resources"][0], "resourceclaims");
    assert_eq!(
        hook["rules"][0]["operations"],
        serde_json::json!(["CREATE"])
    );
    assert_eq!(hook["failurePolicy"], "Ignore", "webhook.failurePolicy");
    assert_eq!(hook["sideEffects"], "None");
    // Only claims naming a shared class, in a request or a subrequest, are sent.
    let when = hook["matchConditions"][0]["expression"].as_str().unwrap();
    assert!(
        when.contains("r.exactly.deviceClassName.endsWith('.shared.mig.das.com')")
            && when.contains("s.deviceClassName.endsWith('.shared.mig.das.com')"),
        "{when}"
    );
    // System namespaces and DAS's own are not, as for the legacy pods' hook.
    let excluded = &hook["namespaceSelector"]["matchExpressions"][0]["values"];
    assert!(
        excluded
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v == "das-system"),
        "{excluded}"
    );
    // The rule is the default: neither program is told to let shares cross namespaces.
    let plugin = r.container("DaemonSet", "das-kubelet-plugin").unwrap();
    assert_eq!(env_of(plugin, "DAS_SHARES_ACROSS_NAMESPACES"), None);
    let webhook = r.container("Deployment", "das-webhook").unwrap();
    assert_eq!(
        env_of(webhook, "DAS_WEBHOOK_SHARES_ACROSS_NAMESPACES"),
        None
    );
}

#[test]
fn sharing_across_namespaces_is_one_value_for_both_programs() {
    let opts = RenderOptions::default()
        .set("sharing.profiles={1g.10gb}")
        .set("sharing.acrossNamespaces=true");
    chart::lint(&opts).unwrap_or_else(|e| panic!("helm lint: {e:#}"));
    let r = Rendered::new(&opts).unwrap();
    // Sent all the same: a share's capacity is checked whatever the namespaces.
    assert!(
        shared_claims_hook(&r).is_some(),
        "claims for a shared class are reviewed"
    );
    let plugin = r.container("DaemonSet", "das-kubelet-plugin").unwrap();
    assert_eq!(
        env_of(plugin, "DAS_SHARES_ACROSS_NAMESPACES").as_deref(),
        Some("true")
    );
    let webhook = r.container("Deployment", "das-webhook").unwrap();
    assert_eq!(
        env_of(webhook, "DAS_WEBHOOK_SHARES_ACROSS_NAMESPACES").as_deref(),
        Some("true")
    );
    // A typo is refused, not ignored.
    let e = chart::render_yaml(&RenderOptions::default().set("sharing.acrossNamespace=true"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("acrossNamespace"), "{e}");
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

/// `gpu` among the shared profiles (docs/design.md §7, "Memory slices of a whole GPU"): the
/// plugin publishes the shareable devices of its whole GPUs, and the chart renders the class
/// `gpu.shared.mig.das.com` selecting them with the MPS strategy; claims of that class get the
/// tenant selector like every shared class. Without whole GPUs it is refused with why.
#[test]
fn gpu_among_the_shared_profiles_renders_the_shared_whole_gpu_class() {
    let opts = RenderOptions::default()
        .set("sharing.profiles={gpu,1g.10gb}")
        .set("wholeGpus.enabled=true");
    chart::lint(&opts).unwrap_or_else(|e| panic!("helm lint: {e:#}"));
    let r = Rendered::new(&opts).unwrap();
    let plugin = r.container("DaemonSet", "das-kubelet-plugin").unwrap();
    assert_eq!(
        env_of(plugin, "DAS_SHARED_PROFILES").as_deref(),
        Some("gpu,1g.10gb")
    );
    let name = das_api::shared_whole_gpu_device_class();
    assert_eq!(name, "gpu.shared.mig.das.com");
    let class = r.get("DeviceClass", &name).unwrap();
    assert_eq!(
        class["spec"]["selectors"][0]["cel"]["expression"],
        "device.driver == 'mig.das.com' && device.attributes['mig.das.com'].type == 'gpu-shared'"
    );
    let decoded = device_config::decode(&class["spec"]["config"][0]["opaque"]["parameters"])
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(decoded.sharing.unwrap().strategy, SharingStrategy::Mps);
    // Two shared classes: the whole GPUs' and 1g.10gb's; the webhook sends their claims.
    assert_eq!(shared_classes(&r).len(), 2);
    assert!(shared_claims_hook(&r).is_some());

    let e = chart::render_yaml(&RenderOptions::default().set("sharing.profiles={gpu}"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("needs wholeGpus.enabled"), "{e}");
}
