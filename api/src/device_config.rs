//! DAS's device configuration API (docs/design.md §3, "Device configuration"): the opaque
//! parameters a ResourceClaim or a DeviceClass gives DAS's devices
//! (`spec.devices.config[].opaque` with `driver: mig.das.com`; KEP-4381 leaves their validation
//! and versioning to the driver), and how the configs of one allocation resolve per request.
//!
//! Decoding is strict: an unknown `apiVersion`, `kind` or field, or a value of the wrong type,
//! is an error that says what is wrong and what is valid. Configs for other drivers are ignored.
//! Class configs apply first, claim configs after them (the later one wins for a request), in the
//! order the allocation lists them (`status.allocation.devices.config`: the scheduler copies the
//! classes' configs before the claim's).
//!
//! Version `v1alpha1` has one kind, [`MigDeviceConfig`], with one sharing strategy,
//! [`SharingStrategy::Exclusive`] (the default: one claim, its containers alone on the slice).

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimSpec};
use serde::{Deserialize, Serialize};

use crate::DRIVER_NAME;

/// The `apiVersion` of DAS's configs.
pub const API_VERSION: &str = "mig.das.com/v1alpha1";
/// The kind that configures a MIG device (or a whole GPU).
pub const KIND_MIG_DEVICE_CONFIG: &str = "MigDeviceConfig";

/// The configuration of the devices of one request (`kind: MigDeviceConfig`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MigDeviceConfig {
    /// How the device's slice is shared; absent: [`SharingStrategy::Exclusive`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing: Option<Sharing>,
}

/// How a slice is shared (`sharing`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Sharing {
    /// The strategy.
    pub strategy: SharingStrategy,
}

/// A sharing strategy (`sharing.strategy`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum SharingStrategy {
    /// The claim's containers alone use the slice (the only strategy of `v1alpha1`).
    #[default]
    Exclusive,
}

/// The envelope every config has: `apiVersion` and `kind` select the type the rest decodes as.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TypeMeta {
    api_version: Option<String>,
    kind: Option<String>,
}

/// Decodes one config's `parameters` strictly.
///
/// # Errors
/// What is wrong and what is valid: not an object, a missing or unknown `apiVersion` or `kind`,
/// an unknown field or a wrong value (serde's message, which names the field and the expected
/// fields or variants).
pub fn decode(parameters: &serde_json::Value) -> Result<MigDeviceConfig, String> {
    let Some(object) = parameters.as_object() else {
        return Err(format!(
            "the parameters are not an object; write {{\"apiVersion\": \"{API_VERSION}\", \"kind\": \"{KIND_MIG_DEVICE_CONFIG}\", …}}"
        ));
    };
    let meta: TypeMeta = serde_json::from_value(parameters.clone())
        .map_err(|e| format!("apiVersion and kind must be strings: {e}"))?;
    match meta.api_version.as_deref() {
        Some(API_VERSION) => {}
        Some(other) => {
            return Err(format!(
                "unknown apiVersion {other:?}; valid: {API_VERSION}"
            ));
        }
        None => return Err(format!("apiVersion is missing; valid: {API_VERSION}")),
    }
    match meta.kind.as_deref() {
        Some(KIND_MIG_DEVICE_CONFIG) => {}
        Some(other) => {
            return Err(format!(
                "unknown kind {other:?} in {API_VERSION}; valid: {KIND_MIG_DEVICE_CONFIG}"
            ));
        }
        None => return Err(format!("kind is missing; valid: {KIND_MIG_DEVICE_CONFIG}")),
    }
    let mut rest = object.clone();
    rest.remove("apiVersion");
    rest.remove("kind");
    serde_json::from_value(serde_json::Value::Object(rest))
        .map_err(|e| format!("{KIND_MIG_DEVICE_CONFIG}: {e}"))
}

/// The config of each request of `rc`'s allocation that DAS serves, by request name as the
/// allocation results name it (`<request>` or `<request>/<subrequest>`): DAS's configs of
/// `status.allocation.devices.config` applied in order (class configs, then the claim's), a
/// config without `requests` to every one of DAS's requests, one naming `<request>` also to its
/// subrequests. A request no config names gets the default.
///
/// # Errors
/// A config of DAS's that is not opaque or does not decode ([`decode`]), or that names a request
/// to which DAS was allocated nothing, with the config's position and source.
pub fn resolve(rc: &ResourceClaim) -> Result<BTreeMap<String, MigDeviceConfig>, String> {
    let Some(devices) = rc
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
    else {
        return Ok(BTreeMap::new());
    };
    let ours: Vec<&str> = devices
        .results
        .iter()
        .flatten()
        .filter(|r| r.driver == DRIVER_NAME)
        .map(|r| r.request.as_str())
        .collect();
    let mut out: BTreeMap<String, MigDeviceConfig> = ours
        .iter()
        .map(|r| (r.to_string(), MigDeviceConfig::default()))
        .collect();
    for (i, c) in devices.config.iter().flatten().enumerate() {
        let at = format!("config {i} (from {})", c.source);
        let Some(opaque) = &c.opaque else {
            // Other kinds of config may come in later API versions; none can be for DAS yet.
            continue;
        };
        if opaque.driver != DRIVER_NAME {
            continue;
        }
        let config = decode(&opaque.parameters.0).map_err(|e| format!("{at}: {e}"))?;
        let named = c.requests.as_deref().unwrap_or_default();
        let targets: Vec<&str> = if named.is_empty() {
            ours.clone()
        } else {
            let mut t = Vec::new();
            for n in named {
                let hit: Vec<&str> = ours
                    .iter()
                    .copied()
                    .filter(|r| {
                        *r == n
                            || r.strip_prefix(n.as_str())
                                .is_some_and(|s| s.starts_with('/'))
                    })
                    .collect();
                if hit.is_empty() {
                    return Err(format!(
                        "{at}: names request {n:?}, but DAS was allocated nothing for it; DAS's requests in this claim: {}",
                        ours.join(", ")
                    ));
                }
                t.extend(hit);
            }
            t
        };
        for r in targets {
            out.insert(r.to_string(), config.clone());
        }
    }
    Ok(out)
}

/// Checks the configs for DAS in a claim's spec (a ResourceClaim's `spec`, a
/// ResourceClaimTemplate's `spec.spec`) as admission does, before anything is allocated: each
/// opaque config for `mig.das.com` must decode ([`decode`]); other drivers' configs are not
/// looked at. That a config's `requests` name requests of the claim is the API server's own
/// validation; whether DAS is allocated them is known only at prepare ([`resolve`]).
///
/// # Errors
/// The first config that does not decode, by its field path, with [`decode`]'s message (the same
/// words a prepare of such a claim fails with).
pub fn validate_spec(spec: &ResourceClaimSpec) -> Result<(), String> {
    let configs = spec.devices.as_ref().and_then(|d| d.config.as_ref());
    for (i, c) in configs.into_iter().flatten().enumerate() {
        let Some(opaque) = c.opaque.as_ref().filter(|o| o.driver == DRIVER_NAME) else {
            continue;
        };
        decode(&opaque.parameters.0)
            .map_err(|e| format!("spec.devices.config[{i}].opaque.parameters: {e}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
