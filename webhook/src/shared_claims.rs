//! Shares stay in their namespace (docs/design.md §8, "Shared slices at admission"; §7, "Shares
//! are a tenant's own"): a ResourceClaim created in namespace `ns` that asks for a shared class
//! (`<profile>.shared.mig.das.com`) gets, on each such request (an `exactly` request, or each
//! such subrequest of `firstAvailable`), the CEL selector
//! [`das_api::share_namespace_selector`]`(ns)`: the scheduler then allocates it only shareable
//! devices whose slice no claim holds or the claims of `ns` hold (the node plugin publishes
//! their namespace as the attribute `shareNamespace`). Pure: the server answers with the patch.
//!
//! Claims from a ResourceClaimTemplate are created through the API server by
//! kube-controller-manager in the pod's namespace and pass admission too, so templates need no
//! change. Selectors of one request are ANDed: a selector the claim brings cannot widen this one.
//!
//! Source: the DRA API (`resource.k8s.io/v1` `DeviceRequest`, `ExactDeviceRequest`,
//! `DeviceSubRequest`: `selectors` at most 32, `DeviceSelectorsMaxSize`); JSON patch RFC 6902.

use serde_json::{Value, json};

/// Most selectors one request or subrequest may have (the API's `DeviceSelectorsMaxSize`).
pub const MAX_SELECTORS: usize = 32;

/// What admission does with one claim.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// No request asks for a shared class (or each has the selector already): admitted as is.
    Unchanged,
    /// The selector added to the (sub)requests named (`<request>` or `<request>/<subrequest>`).
    Patched {
        /// RFC 6902 patch against the claim as received.
        patch: json_patch::Patch,
        /// The (sub)requests that got the selector.
        requests: Vec<String>,
    },
    /// The claim cannot take the selector: the message says why and what is valid.
    Denied(String),
}

/// Whether `class` is a shared class of DAS: `<profile>.shared.mig.das.com` (docs/design.md §3).
pub fn is_shared_class(class: &str) -> bool {
    class
        .strip_suffix(&format!(".shared.{}", das_api::DRIVER_NAME))
        .is_some_and(|profile| !profile.is_empty())
}

/// Reviews `claim` (a ResourceClaim as JSON) created in `namespace`: refuses a request or
/// subrequest of a shared class whose capacity request no shareable device can be given
/// ([`capacity_refusal`]), and, when shares stay in their namespace (`scoped`), adds
/// [`das_api::share_namespace_selector`] to each one that lacks it. Shapes it does not know (no
/// `spec.devices.requests`, a request without `deviceClassName`) are left for the API server's
/// validation.
pub fn review(namespace: &str, claim: &Value, scoped: bool) -> Verdict {
    let selector = das_api::share_namespace_selector(namespace);
    let mut after = claim.clone();
    let Some(requests) = after
        .pointer_mut("/spec/devices/requests")
        .and_then(Value::as_array_mut)
    else {
        return Verdict::Unchanged;
    };
    let mut wanted = Vec::new();
    for request in requests.iter_mut() {
        let name = request["name"].as_str().unwrap_or_default().to_string();
        if request.get("exactly").is_some() {
            wanted.push((name.clone(), &mut request["exactly"]));
        } else if let Some(subs) = request
            .get_mut("firstAvailable")
            .and_then(Value::as_array_mut)
        {
            for sub in subs {
                let sub_name = sub["name"].as_str().unwrap_or_default();
                wanted.push((format!("{name}/{sub_name}"), sub));
            }
        }
    }
    let mut patched = Vec::new();
    for (name, request) in wanted {
        let class = request["deviceClassName"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if !is_shared_class(&class) {
            continue;
        }
        if let Some(why) = capacity_refusal(&name, &class, request) {
            return Verdict::Denied(why);
        }
        if !scoped {
            continue;
        }
        match add_selector(request, &selector) {
            Added::Yes => patched.push(name),
            Added::AlreadyThere => {}
            Added::Full => return Verdict::Denied(full(&name, &class, namespace)),
        }
    }
    if patched.is_empty() {
        return Verdict::Unchanged;
    }
    // The namespace is part of the selector's text: one that is no DNS label (never, from an
    // API server) would need escaping; refuse rather than write a selector that means otherwise.
    if !is_dns_label(namespace) {
        return Verdict::Denied(format!(
            "das-webhook: namespace {namespace:?} is not a DNS label, so the selector that keeps shared slices within a namespace cannot name it"
        ));
    }
    Verdict::Patched {
        patch: json_patch::diff(claim, &after),
        requests: patched,
    }
}

/// Why (sub)request `name` of shared class `class` asks for capacity no shareable device gives
/// (docs/design.md §7, "Shared slices" and "Memory slices of a whole GPU"): `memory` that is not
/// a whole number of [`das_api::capacities::MEMORY_STEP_BYTES`] (256Mi) steps, or `shares` that is
/// not a whole number from 1 to [`das_api::capacities::MAX_SHARES`]. `None` when it asks for
/// neither or both are valid. A request larger than any device stays Pending with the
/// scheduler's reason: what a node offers is the scheduler's to know.
pub fn capacity_refusal(name: &str, class: &str, request: &Value) -> Option<String> {
    use das_api::capacities::{MAX_SHARES, MEMORY, MEMORY_STEP_BYTES, SHARES};
    let requests = request.pointer("/capacity/requests")?.as_object()?;
    let text = |v: &Value| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    if let Some(memory) = requests.get(MEMORY).map(text) {
        let ok = das_api::device_config::quantity_bytes(&memory)
            .is_ok_and(|b| b > 0 && b % MEMORY_STEP_BYTES == 0);
        if !ok {
            return Some(format!(
                "das-webhook: request {name:?} asks for memory {memory:?} of shared class {class}; valid is a whole number of 256Mi steps (256Mi, 512Mi, …, 8Gi, …) up to a device's memory"
            ));
        }
    }
    if let Some(shares) = requests.get(SHARES).map(text) {
        let ok = shares
            .trim()
            .parse::<u64>()
            .is_ok_and(|n| (1..=MAX_SHARES).contains(&n));
        if !ok {
            return Some(format!(
                "das-webhook: request {name:?} asks for shares {shares:?} of shared class {class}; valid is a whole number from 1 to the device's shares (at most {MAX_SHARES})"
            ));
        }
    }
    None
}

/// What [`add_selector`] did.
enum Added {
    Yes,
    AlreadyThere,
    /// The request has [`MAX_SELECTORS`] already.
    Full,
}

/// Appends the CEL selector `expression` to `request`'s `selectors`, unless it is there (a
/// reinvocation).
fn add_selector(request: &mut Value, expression: &str) -> Added {
    let selector = json!({"cel": {"expression": expression}});
    let Some(map) = request.as_object_mut() else {
        return Added::AlreadyThere;
    };
    let selectors = map.entry("selectors").or_insert_with(|| json!([]));
    if selectors.is_null() {
        *selectors = json!([]);
    }
    let Some(list) = selectors.as_array_mut() else {
        // Not a list: the API server's validation says so better than we could.
        return Added::AlreadyThere;
    };
    if list.contains(&selector) {
        return Added::AlreadyThere;
    }
    if list.len() >= MAX_SELECTORS {
        return Added::Full;
    }
    list.push(selector);
    Added::Yes
}

/// The denial of a (sub)request with no room for the selector.
fn full(request: &str, class: &str, namespace: &str) -> String {
    format!(
        "das-webhook: request {request:?} asks for shared class {class} with {MAX_SELECTORS} selectors, the most a request may have; das-webhook adds one that keeps shared slices within namespace {namespace} (docs/design.md §8), so give the request at most {} selectors",
        MAX_SELECTORS - 1
    )
}

/// Whether `s` is an RFC 1123 DNS label (what a namespace's name is).
fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

#[cfg(test)]
mod tests;
