use super::*;
use crate::triggers::claims_of_pod;
use serde_json::json;

#[test]
fn the_pod_cache_keeps_only_what_the_mirror_reads() {
    let mut pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "u", "resourceVersion": "7",
            "labels": {"a": "b"}, "annotations": {"big": "x".repeat(10_000)},
            "managedFields": [{"manager": "kubectl"}]},
        "spec": {"nodeName": "n0", "containers": [{"name": "c", "image": "i",
            "env": [{"name": "A", "value": "x".repeat(10_000)}],
            "resources": {"limits": {"cpu": "1"}, "claims": [{"name": "a"}]}}],
            "resourceClaims": [{"name": "a", "resourceClaimName": "shared"}]},
        "status": {"phase": "Running", "podIP": "10.0.0.1",
            "resourceClaimStatuses": [{"name": "a", "resourceClaimName": "shared"}]}
    }))
    .unwrap();
    let before = serde_json::to_vec(&pod).unwrap().len();
    let mapped = claims_of_pod(&pod);
    keep_what_the_mirror_needs(&mut pod);
    let after = serde_json::to_vec(&pod).unwrap().len();
    assert!(after * 20 < before, "{before} -> {after} bytes");
    assert_eq!(pod.metadata.uid.as_deref(), Some("u"));
    assert_eq!(pod.spec.as_ref().unwrap().node_name.as_deref(), Some("n0"));
    assert!(pod.metadata.labels.is_none() && pod.metadata.managed_fields.is_none());
    assert_eq!(
        crate::device_info::containers_using(&pod, "shared", "r"),
        ["c"],
        "which container uses which claim is kept"
    );
    let c = &pod.spec.as_ref().unwrap().containers[0];
    assert!(c.image.is_none() && c.env.is_none());
    assert!(c.resources.as_ref().unwrap().limits.is_none());
    assert_eq!(claims_of_pod(&pod), mapped, "the claim mapping is the same");
}

#[test]
fn our_slices_are_listed_in_small_pages() {
    let cfg = slice_watch_config();
    assert_eq!(cfg.page_size, Some(SLICE_PAGE_SIZE));
    assert!(SLICE_PAGE_SIZE < watcher::Config::default().page_size.unwrap());
    assert_eq!(
        cfg.field_selector.as_deref(),
        Some("spec.driver=mig.das.com")
    );
}
