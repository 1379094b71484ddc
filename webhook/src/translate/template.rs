//! The ResourceClaimTemplates the translation points MIG requests at, and how an existing one
//! is compared with the one the webhook would make.

use das_api::{LEGACY_RESOURCE_PREFIX, legacy_class, profile_dns_label};
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use serde_json::json;

use super::{MANAGED_BY_LABEL, REQUEST_NAME, TEMPLATE_PREFIX};

/// Name of the template that asks for `count` slices of `profile`: `das-mig-1g-10gb-x2`.
pub fn template_name(profile: &str, count: u32) -> String {
    format!("{TEMPLATE_PREFIX}{}-x{count}", profile_dns_label(profile))
}

/// The ResourceClaimTemplate named [`template_name`]: `count` devices of `<profile>.mig.das.com`.
pub fn template(profile: &str, count: u32) -> ResourceClaimTemplate {
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": template_name(profile, count),
            "labels": {MANAGED_BY_LABEL.0: MANAGED_BY_LABEL.1},
            "annotations": {"mig.das.com/legacy-resource":
                format!("{LEGACY_RESOURCE_PREFIX}{profile}")},
        },
        "spec": {"spec": {"devices": {"requests": [{"name": REQUEST_NAME, "exactly": {
            "deviceClassName": legacy_class(profile),
            "allocationMode": "ExactCount", "count": count}}]}}}
    }))
    .expect("a ResourceClaimTemplate deserializes")
}

/// Why an existing template named like one the webhook makes cannot serve as it: `None` when it
/// asks for exactly what `desired` asks for (one request `mig` of `count` devices of the
/// profile's class, nothing else); otherwise what it asks for instead. The API server's defaults
/// (`allocationMode: ExactCount`, `count: 1`) are taken into account.
pub fn template_mismatch(
    existing: &ResourceClaimTemplate,
    desired: &ResourceClaimTemplate,
) -> Option<String> {
    let shape = |t: &ResourceClaimTemplate| -> serde_json::Value {
        let devices = serde_json::to_value(&t.spec.spec.devices).unwrap_or_default();
        let requests: Vec<serde_json::Value> = devices["requests"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| {
                let e = &r["exactly"];
                json!({
                    "name": r["name"],
                    "class": e["deviceClassName"],
                    "mode": e["allocationMode"].as_str().unwrap_or("ExactCount"),
                    "count": e["count"].as_i64().unwrap_or(1),
                    "selectors": e["selectors"].as_array().map_or(0, Vec::len),
                    "adminAccess": e["adminAccess"].as_bool().unwrap_or(false),
                    "tolerations": e["tolerations"].as_array().map_or(0, Vec::len),
                    "firstAvailable": r["firstAvailable"].as_array().map_or(0, Vec::len),
                })
            })
            .collect();
        json!({
            "requests": requests,
            "constraints": devices["constraints"].as_array().map_or(0, Vec::len),
            "config": devices["config"].as_array().map_or(0, Vec::len),
        })
    };
    let (have, want) = (shape(existing), shape(desired));
    (have != want).then(|| format!("it asks for {have}, not {want}"))
}
