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
//! Version `v1alpha1` has one kind, [`MigDeviceConfig`], with three sharing strategies:
//! [`SharingStrategy::Exclusive`] (the default: one claim, its containers alone on the slice),
//! [`SharingStrategy::Mps`] (the claim's containers share the slice through an MPS control daemon
//! of its own, with the limits of [`MpsConfig`]) and [`SharingStrategy::TimeSlicing`] (a whole
//! GPU's time slice for the claim's containers, [`TimeSlicingConfig`]).

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde::{Deserialize, Deserializer, Serialize};

use crate::DRIVER_NAME;

/// The `apiVersion` of DAS's configs.
pub const API_VERSION: &str = "mig.das.com/v1alpha1";
/// The kind that configures a MIG device (or a whole GPU).
pub const KIND_MIG_DEVICE_CONFIG: &str = "MigDeviceConfig";

/// The configuration of the devices of one request (`kind: MigDeviceConfig`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MigDeviceConfig {
    /// How the device's slice is shared; absent: [`SharingStrategy::Exclusive`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing: Option<Sharing>,
}

impl MigDeviceConfig {
    /// The MPS settings when the strategy is [`SharingStrategy::Mps`] (an absent `mps` is the
    /// default: no limits); `None` for an exclusive device.
    pub fn mps(&self) -> Option<MpsConfig> {
        let sharing = self.sharing.as_ref()?;
        (sharing.strategy == SharingStrategy::Mps).then(|| sharing.mps.clone().unwrap_or_default())
    }

    /// The time slice when the strategy is [`SharingStrategy::TimeSlicing`] (an absent
    /// `timeSlicing` is [`TimeSliceInterval::Default`]); `None` for any other strategy.
    pub fn time_slice(&self) -> Option<TimeSliceInterval> {
        let sharing = self.sharing.as_ref()?;
        (sharing.strategy == SharingStrategy::TimeSlicing).then(|| {
            sharing
                .time_slicing
                .as_ref()
                .map_or(TimeSliceInterval::Default, |t| t.interval)
        })
    }

    /// The checks serde cannot make: `mps` only with strategy `MPS`, `timeSlicing` only with
    /// strategy `TimeSlicing`, and a pinned memory limit that is a quantity of at least 1 MiB.
    ///
    /// # Errors
    /// What is wrong and what is valid, naming the field.
    pub fn validate(&self) -> Result<(), String> {
        let Some(sharing) = &self.sharing else {
            return Ok(());
        };
        let strategy = sharing.strategy;
        if sharing.mps.is_some() && strategy != SharingStrategy::Mps {
            return Err(format!(
                "sharing.mps is set but sharing.strategy is {}; set strategy: MPS, or remove mps",
                strategy.name()
            ));
        }
        if sharing.time_slicing.is_some() && strategy != SharingStrategy::TimeSlicing {
            return Err(format!(
                "sharing.timeSlicing is set but sharing.strategy is {}; set strategy: TimeSlicing, or remove timeSlicing",
                strategy.name()
            ));
        }
        match &sharing.mps {
            Some(mps) => mps
                .pinned_device_memory_limit_mib()
                .map(|_| ())
                .map_err(|e| e.to_string()),
            None => Ok(()),
        }
    }
}

/// How a slice is shared (`sharing`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Sharing {
    /// The strategy.
    pub strategy: SharingStrategy,
    /// The MPS limits (`sharing.mps`); only with [`SharingStrategy::Mps`], optional there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps: Option<MpsConfig>,
    /// The time slice (`sharing.timeSlicing`); only with [`SharingStrategy::TimeSlicing`],
    /// optional there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_slicing: Option<TimeSlicingConfig>,
}

/// A sharing strategy (`sharing.strategy`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum SharingStrategy {
    /// The claim's containers alone use the slice, each CUDA process with its own context.
    #[default]
    Exclusive,
    /// The claim's containers use the slice through one MPS control daemon per slice (NVIDIA
    /// CUDA Multi-Process Service): their CUDA processes share the slice's compute concurrently,
    /// within the limits of [`MpsConfig`] (docs/design.md §7, "MPS on a slice").
    #[serde(rename = "MPS")]
    Mps,
    /// The claim's containers (of every pod that shares the claim) take turns on a whole GPU,
    /// each CUDA context for the GPU's time slice ([`TimeSlicingConfig`]; NVIDIA's
    /// `TimeSlicing`, docs/design.md §7, "Time-slicing"). Whole GPUs only: a MIG instance's
    /// compute is its own.
    TimeSlicing,
}

impl SharingStrategy {
    /// The name a config writes (`Exclusive`, `MPS`, `TimeSlicing`).
    pub fn name(self) -> &'static str {
        match self {
            SharingStrategy::Exclusive => "Exclusive",
            SharingStrategy::Mps => "MPS",
            SharingStrategy::TimeSlicing => "TimeSlicing",
        }
    }
}

/// The time-slicing settings of a whole GPU (`sharing.timeSlicing`), NVIDIA's
/// `TimeSlicingConfig`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TimeSlicingConfig {
    /// How long each CUDA context runs before the GPU switches to the next; absent:
    /// [`TimeSliceInterval::Default`].
    #[serde(default, deserialize_with = "interval")]
    pub interval: TimeSliceInterval,
}

/// A GPU's compute time slice (`sharing.timeSlicing.interval`), as NVIDIA names it: the
/// driver's default, or a short, medium or long slice. NVIDIA publishes no duration for them;
/// they are the levels 0 to 3 of `nvidia-smi compute-policy --set-timeslice` ([`Self::level`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TimeSliceInterval {
    /// The driver's default time slice (level 0): what a GPU has when nobody set one.
    #[default]
    Default,
    /// Level 1: more switches, lower latency for each context.
    Short,
    /// Level 2.
    Medium,
    /// Level 3: fewer switches, more throughput for long kernels.
    Long,
}

impl TimeSliceInterval {
    /// The level `nvidia-smi compute-policy --set-timeslice` takes: 0 (Default) to 3 (Long),
    /// as NVIDIA's DRA driver maps them (`TimeSliceInterval.Int()`).
    pub fn level(self) -> u32 {
        match self {
            TimeSliceInterval::Default => 0,
            TimeSliceInterval::Short => 1,
            TimeSliceInterval::Medium => 2,
            TimeSliceInterval::Long => 3,
        }
    }
}

/// The limits of an MPS device (`sharing.mps`), set through the slice's MPS control daemon as
/// its defaults for every client (NVIDIA's `nvidia-cuda-mps-control` commands
/// `set_default_active_thread_percentage` and `set_default_device_pinned_mem_limit`). Absent
/// fields set no limit.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MpsConfig {
    /// The share of the slice's multiprocessors each client's kernels may use, in percent
    /// (1 to 100).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "percentage"
    )]
    pub active_thread_percentage: Option<u8>,
    /// The device memory each client may pin, a Kubernetes quantity (`2Gi`, `512Mi`); applied
    /// in whole MiB (rounded down), at least 1 MiB, at most the slice's memory (checked at
    /// prepare, where the slice is known).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned_device_memory_limit: Option<Quantity>,
}

/// Why `sharing.mps.pinnedDeviceMemoryLimit` is not valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PinnedLimitError {
    /// Not a memory size.
    #[error("sharing.mps.pinnedDeviceMemoryLimit {value:?}: {source}")]
    Quantity {
        /// The quantity as written.
        value: String,
        /// What is wrong with it.
        source: QuantityError,
    },
    /// Less than 1 MiB (limits are applied in whole MiB).
    #[error(
        "sharing.mps.pinnedDeviceMemoryLimit {value:?} is below 1Mi; valid: a memory size of at least 1Mi, e.g. 2Gi"
    )]
    BelowOneMib {
        /// The quantity as written.
        value: String,
    },
}

impl MpsConfig {
    /// The pinned memory limit in MiB (bytes / 2^20, rounded down), if one is set.
    ///
    /// # Errors
    /// The quantity does not parse ([`quantity_bytes`]) or is below 1 MiB.
    pub fn pinned_device_memory_limit_mib(&self) -> Result<Option<u64>, PinnedLimitError> {
        let Some(q) = &self.pinned_device_memory_limit else {
            return Ok(None);
        };
        let bytes = quantity_bytes(&q.0).map_err(|source| PinnedLimitError::Quantity {
            value: q.0.clone(),
            source,
        })?;
        match bytes >> 20 {
            0 => Err(PinnedLimitError::BelowOneMib { value: q.0.clone() }),
            mib => Ok(Some(mib)),
        }
    }
}

/// Reads `activeThreadPercentage`: an integer from 1 to 100, anything else an error that
/// names the field and the range.
/// `sharing.timeSlicing.interval`: one of NVIDIA's four names, or an error naming them.
fn interval<'de, D: Deserializer<'de>>(d: D) -> Result<TimeSliceInterval, D::Error> {
    let v = serde_json::Value::deserialize(d)?;
    TimeSliceInterval::deserialize(&v).map_err(|_| {
        serde::de::Error::custom(format!(
            "sharing.timeSlicing.interval {v} is not valid; valid: Default, Short, Medium, Long"
        ))
    })
}

fn percentage<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u8>, D::Error> {
    let v = serde_json::Value::deserialize(d)?;
    match v.as_u64() {
        Some(n @ 1..=100) => Ok(Some(n as u8)),
        _ => Err(serde::de::Error::custom(format!(
            "sharing.mps.activeThreadPercentage {v} is not valid; valid: an integer from 1 to 100"
        ))),
    }
}

/// What a quantity that is no memory size is told with: what is valid.
const VALID_QUANTITY: &str = "valid: a number with an optional suffix Ki, Mi, Gi, Ti, Pi, k, M, G, T, P or exponent, e.g. 2Gi or 512Mi";

/// Why a quantity is no memory size ([`quantity_bytes`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// Not a Kubernetes quantity at all.
    #[error("not a quantity ({0}); {VALID_QUANTITY}")]
    Syntax(String),
    /// Below zero.
    #[error("negative; {VALID_QUANTITY}")]
    Negative,
    /// Milli-units (`100m`): fractions of a byte.
    #[error("a fraction of a byte; {VALID_QUANTITY}")]
    Fraction,
    /// More bytes than 64 bits hold.
    #[error("too large; {VALID_QUANTITY}")]
    TooLarge,
}

/// The bytes of a Kubernetes quantity (`apimachinery` `resource.Quantity`, parsed by the
/// `kube_quantity` crate): a decimal number (`1`, `1.5`), then a binary suffix (`Ki` … `Pi`:
/// powers of 1024), a decimal one (`k` … `P`: powers of 1000), or an exponent (`1e9`);
/// fractions of a byte (`1.5` bytes) are dropped. Negative values and milli-units (`m`) are no
/// memory size; the exa suffixes (`Ei`, `E`) are refused, as the crate reads `E` as an exponent
/// (no slice has that much memory).
///
/// # Errors
/// What is not valid, and what is.
pub fn quantity_bytes(q: &str) -> Result<u64, QuantityError> {
    use kube_quantity::ParsedQuantity;
    // The crate takes a bare suffix (`Gi`) as zero; Kubernetes wants a number first.
    let number = q.trim().trim_start_matches(['+', '-']);
    if !number.starts_with(|c: char| c.is_ascii_digit() || c == '.') {
        return Err(QuantityError::Syntax("no number".to_string()));
    }
    let parsed =
        ParsedQuantity::try_from(q.trim()).map_err(|e| QuantityError::Syntax(e.to_string()))?;
    let zero = ParsedQuantity::default();
    if parsed < zero {
        return Err(QuantityError::Negative);
    }
    // Adding a quantity of scale one brings the value to whole units (`1.5Gi` to 1610612736),
    // which the crate's integer conversions need: they drop the fraction before they scale.
    // A milli-unit keeps its smaller scale and converts to nothing.
    let bytes = (parsed.clone() + zero).to_bytes_u128();
    let milli = parsed.to_string().ends_with('m');
    match bytes {
        _ if milli => Err(QuantityError::Fraction),
        Some(b) => u64::try_from(b).map_err(|_| QuantityError::TooLarge),
        None => Err(QuantityError::TooLarge),
    }
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
/// fields or variants), or a check of [`MigDeviceConfig::validate`].
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
    let config: MigDeviceConfig = serde_json::from_value(serde_json::Value::Object(rest))
        .map_err(|e| format!("{KIND_MIG_DEVICE_CONFIG}: {e}"))?;
    config
        .validate()
        .map_err(|e| format!("{KIND_MIG_DEVICE_CONFIG}: {e}"))?;
    Ok(config)
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
