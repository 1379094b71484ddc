//! What must be written to bring a stored AllocationClaim to the desired one: the comparison of
//! the fields the controller owns, and the transition times carried over so an unchanged claim
//! compares equal and costs no write.

use das_api::allocation::{AllocationClaim, CONDITION_DEVICE_HEALTHY};
use kube::ResourceExt;

/// Keeps each of `existing`'s conditions (and so its transition time) in `desired` where the
/// condition of that type has the same status and reason, so an unchanged claim compares equal
/// and is not written. A condition `desired` lacks is kept too when the device's health is
/// merely unknown for now (its slice is not published).
pub fn carry_transition_time(desired: &mut AllocationClaim, existing: &AllocationClaim) {
    let (Some(d), Some(e)) = (desired.status.as_mut(), existing.status.as_ref()) else {
        return;
    };
    for c in &mut d.conditions {
        if let Some(old) = e
            .conditions
            .iter()
            .find(|o| o.type_ == c.type_ && o.status == c.status && o.reason == c.reason)
        {
            *c = old.clone();
        }
    }
    let health_known = d
        .conditions
        .iter()
        .any(|c| c.type_ == CONDITION_DEVICE_HEALTHY);
    if !health_known {
        d.conditions.extend(
            e.conditions
                .iter()
                .filter(|c| c.type_ == CONDITION_DEVICE_HEALTHY)
                .cloned(),
        );
    }
}

/// The object apply of `desired`: the body (status left out, the status subresource is written
/// apart) and the object as the apply will leave it, `current`'s status kept (what the
/// controller records as its own write before sending it).
pub fn object_apply(
    desired: &AllocationClaim,
    current: Option<&AllocationClaim>,
) -> (AllocationClaim, AllocationClaim) {
    let mut body = desired.clone();
    body.status = None;
    let mut intended = body.clone();
    intended.status = current.and_then(|c| c.status.clone());
    (body, intended)
}

/// What must be written to make `existing` (if any) look like `desired`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Writes {
    /// Spec, labels or owner references differ (or the object does not exist).
    pub object: bool,
    /// Status differs.
    pub status: bool,
}

/// Compares the fields the controller owns.
pub fn writes_needed(desired: &AllocationClaim, existing: Option<&AllocationClaim>) -> Writes {
    let Some(e) = existing else {
        return Writes {
            object: true,
            status: true,
        };
    };
    let labels_ok = desired
        .metadata
        .labels
        .iter()
        .flatten()
        .all(|(k, v)| e.labels().get(k) == Some(v));
    let owners_ok = desired.metadata.owner_references == e.metadata.owner_references;
    Writes {
        object: desired.spec != e.spec || !labels_ok || !owners_ok,
        status: desired.status != e.status,
    }
}
