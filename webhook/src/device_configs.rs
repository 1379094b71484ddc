//! Admission of ResourceClaims and ResourceClaimTemplates (docs/design.md §8, "Device
//! configuration at admission"): their opaque configs for `mig.das.com` must decode, so a bad
//! config is refused when the claim is written instead of when its pod reaches a node. The check
//! itself is [`das_api::device_config::validate_spec`], the one a prepare makes; this module only
//! finds the claim spec in the reviewed object.
//!
//! Source: KEP-4381 ("Structured parameters", admission webhook for opaque parameters): the
//! driver validates its own `opaque.parameters`; configs of other drivers are not looked at.

use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimSpec, ResourceClaimTemplate};
use serde_json::Value;

/// What admission says of one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing of DAS's is wrong (or the object is not a claim or template).
    Allowed,
    /// A config for DAS does not decode: the message names the field and says what is valid.
    Denied(String),
}

/// The kinds reviewed, as `request.kind.kind` names them.
pub const KINDS: [&str; 2] = ["ResourceClaim", "ResourceClaimTemplate"];

/// Reviews `object` (the request's object, as JSON) of `kind`: the claim spec's configs for
/// `mig.das.com` must decode ([`das_api::device_config::validate_spec`]). A kind other than
/// [`KINDS`] is allowed untouched (a registration that sends more than it should must not block
/// it).
///
/// # Errors
/// The object is not a valid ResourceClaim or ResourceClaimTemplate of `resource.k8s.io/v1`
/// (the serde message); the API server converts every served version to `v1` for the webhook
/// (`matchPolicy: Equivalent`), so this means a malformed review, not a bad claim.
pub fn review(kind: &str, object: &Value) -> Result<Verdict, serde_json::Error> {
    let (spec, prefix): (Option<ResourceClaimSpec>, &str) = match kind {
        "ResourceClaim" => (
            Some(serde_json::from_value::<ResourceClaim>(object.clone())?.spec),
            "",
        ),
        "ResourceClaimTemplate" => (
            Some(
                serde_json::from_value::<ResourceClaimTemplate>(object.clone())?
                    .spec
                    .spec,
            ),
            // The claim spec of a template is its `spec.spec`.
            "spec.",
        ),
        _ => (None, ""),
    };
    let Some(spec) = spec else {
        return Ok(Verdict::Allowed);
    };
    Ok(match das_api::device_config::validate_spec(&spec) {
        Ok(()) => Verdict::Allowed,
        Err(e) => Verdict::Denied(format!(
            "the device configuration for {}: {prefix}{e}",
            das_api::DRIVER_NAME
        )),
    })
}

#[cfg(test)]
mod tests;
