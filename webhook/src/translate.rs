//! The pure part of the webhook: a legacy pod (`nvidia.com/mig-<profile>: N`, and with
//! `--translate-whole-gpus` `nvidia.com/gpu: N`, [`whole_gpu`]) becomes a JSON patch plus the
//! ResourceClaimTemplates it needs (docs/design.md §3 names, §8 behaviour).
//!
//! Sources: Pod `spec.resourceClaims` / container `resources.claims` (KEP-4381,
//! <https://kubernetes.io/docs/concepts/scheduling-eviction/dynamic-resource-allocation/>),
//! ResourceClaimTemplate `resource.k8s.io/v1`, JSON patch RFC 6902 (what an AdmissionResponse
//! carries, <https://kubernetes.io/docs/reference/access-authn-authz/extensible-admission-controllers/#response>).

use std::collections::{BTreeMap, BTreeSet};

use das_api::{DRIVER_NAME, LEGACY_RESOURCE_PREFIX, LEGACY_WHOLE_GPU_RESOURCE, profile_dns_label};
use k8s_openapi::api::core::v1::{Container, Pod, PodResourceClaim, ResourceClaim};
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde::Serialize;

mod names;
mod template;
pub mod whole_gpu;

use names::{claim_name, unique_name};
pub use template::{template, template_mismatch, template_name};
pub use whole_gpu::{WholeGpus, whole_gpu_template, whole_gpu_template_name};

/// Annotation that records what the webhook translated: a JSON list of [`Translated`].
pub const TRANSLATION_ANNOTATION: &str = "mig.das.com/legacy-translation";

/// Label on the ResourceClaimTemplates the webhook creates.
pub const MANAGED_BY_LABEL: (&str, &str) = ("app.kubernetes.io/managed-by", "das-webhook");

/// Name of the device request inside a generated template.
pub const REQUEST_NAME: &str = "mig";

/// Prefix of generated template names: `das-mig-<profile as DNS label>-x<count>`.
const TEMPLATE_PREFIX: &str = "das-mig-";

/// One legacy request that was translated, as recorded in [`TRANSLATION_ANNOTATION`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Translated {
    /// The container that asked.
    pub container: String,
    /// The legacy resource, e.g. `nvidia.com/mig-1g.10gb`.
    pub resource: String,
    /// How many slices it asked for.
    pub count: u32,
    /// The pod-level claim entry that stands for it now.
    pub claim: String,
    /// The ResourceClaimTemplate the claim is made from.
    pub template: String,
}

/// What the webhook does to an admitted pod: the patch and the templates that must exist.
#[derive(Debug, Clone, Default)]
pub struct Translation {
    /// RFC 6902 patch against the pod as received; empty when there is nothing to translate.
    pub patch: json_patch::Patch,
    /// Templates the pod's claims point at, one per distinct (profile, count).
    pub templates: Vec<ResourceClaimTemplate>,
    /// What was translated (also in the annotation).
    pub translated: Vec<Translated>,
    /// Warnings for the admission response (deprecated resource spellings).
    pub warnings: Vec<String>,
}

impl Translation {
    /// True when the pod had no legacy request: the webhook allows it unchanged.
    pub fn is_empty(&self) -> bool {
        self.translated.is_empty()
    }
}

/// Why a pod is refused; every problem found is listed, and nothing is applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", .problems.join("; "))]
pub struct Denial {
    /// Every problem found, each a sentence for the user.
    pub problems: Vec<String>,
}

/// One legacy request of one container, validated.
#[derive(Debug, Clone)]
struct LegacyRequest {
    container: String,
    /// The profile as NVIDIA names it (`1g.10gb.me`): the DeviceClass `<this>.mig.das.com`;
    /// [`das_api::WHOLE_GPU_PROFILE`] for `nvidia.com/gpu`.
    profile: String,
    /// The resource suffix as the pod spelled it (a deprecated alias differs from `profile`).
    spelled: String,
    count: u32,
    /// `nvidia.com/gpu` (whole GPUs of `gpu.das.com`), not a MIG profile.
    whole_gpu: bool,
}

impl LegacyRequest {
    /// The legacy resource as the pod named it.
    fn resource(&self) -> String {
        if self.whole_gpu {
            LEGACY_WHOLE_GPU_RESOURCE.to_string()
        } else {
            format!("{LEGACY_RESOURCE_PREFIX}{}", self.spelled)
        }
    }

    /// Name of the template it is made from.
    fn template_name(&self) -> String {
        if self.whole_gpu {
            whole_gpu_template_name(self.count)
        } else {
            template_name(&self.profile, self.count)
        }
    }
}

/// The most devices one ResourceClaim can be allocated: `resource.k8s.io/v1`
/// `AllocationResultsMaxSize` (32). A template asking for more could never be satisfied.
pub const MAX_DEVICES_PER_CLAIM: u32 = 32;

/// What the cluster offers: the profiles with a DeviceClass, as written in the class name
/// (`1g.10gb`, `1g.10gb-me`, see [`offered_profile`]), and, where DAS publishes devices, the
/// most slices of each profile one node can hold at once; whole GPUs when the webhook
/// translates them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Offered {
    /// Profiles with a DeviceClass.
    pub profiles: Vec<String>,
    /// Most slices of a profile that fit on one node (over all nodes), by class-name profile.
    pub max_per_node: BTreeMap<String, u32>,
    /// Whole GPUs for `nvidia.com/gpu`; `None` when the webhook does not translate them
    /// (`--translate-whole-gpus` off): such requests are left alone.
    pub whole_gpus: Option<WholeGpus>,
}

impl From<Vec<String>> for Offered {
    fn from(profiles: Vec<String>) -> Self {
        Self {
            profiles,
            ..Self::default()
        }
    }
}

/// Whether `offered` answers a pod that wants `wanted`, an entry of [`wanted`]: a profile
/// [`resolve_profile`] finds, or whole GPUs ([`LEGACY_WHOLE_GPU_RESOURCE`]) with their class.
pub fn offers(offered: &Offered, wanted: &str) -> bool {
    if wanted == LEGACY_WHOLE_GPU_RESOURCE {
        offered.whole_gpus.as_ref().is_some_and(|w| w.class)
    } else {
        resolve_profile(wanted, &offered.profiles).is_some()
    }
}

/// Translates `pod` against what the cluster offers.
pub fn translate(pod: &Pod, offered: &Offered) -> Result<Translation, Denial> {
    let requests = collect_requests(pod, offered)?;
    if requests.is_empty() {
        return Ok(Translation::default());
    }
    let warnings = deprecation_warnings(&requests);
    let mut out = pod.clone();
    let mut used: BTreeSet<String> = existing_claims(pod).map(|c| c.name.clone()).collect();
    let mut translated = Vec::new();
    for r in &requests {
        let base = if r.whole_gpu {
            whole_gpu::claim_name(&r.container)
        } else {
            claim_name(&r.container, &r.profile)
        };
        let claim = unique_name(&base, &used);
        used.insert(claim.clone());
        let template = r.template_name();
        add_claim(&mut out, r, &claim, &template);
        translated.push(Translated {
            container: r.container.clone(),
            resource: r.resource(),
            count: r.count,
            claim,
            template,
        });
    }
    strip_legacy(&mut out, offered.whole_gpus.is_some());
    annotate(&mut out, &translated);
    let before = serde_json::to_value(pod).expect("a Pod serializes");
    let after = serde_json::to_value(&out).expect("a Pod serializes");
    Ok(Translation {
        patch: json_patch::diff(&before, &after),
        templates: templates_for(&requests),
        translated,
        warnings,
    })
}

/// One warning per deprecated spelling used (`nvidia.com/mig-1g.10gb-me` for
/// `nvidia.com/mig-1g.10gb.me`).
fn deprecation_warnings(requests: &[LegacyRequest]) -> Vec<String> {
    let used: BTreeSet<(&str, &str)> = requests
        .iter()
        .filter(|r| r.spelled != r.profile)
        .map(|r| (r.spelled.as_str(), r.profile.as_str()))
        .collect();
    used.into_iter()
        .map(|(old, new)| {
            format!(
                "{LEGACY_RESOURCE_PREFIX}{old} is deprecated: use {LEGACY_RESOURCE_PREFIX}{new}, the name NVIDIA's device plugin uses"
            )
        })
        .collect()
}

/// The offered profile (NVIDIA's name, the class-name prefix) a legacy resource suffix means:
/// itself when offered; else a deprecated spelling of a `+` profile, when its NVIDIA name is
/// offered: DAS's old `-` (`1g.10gb-me` → `1g.10gb.me`) or the raw `+` (`1g.10gb+me`). `None`
/// when none is.
pub fn resolve_profile(spelled: &str, offered: &[String]) -> Option<String> {
    let is_offered = |p: &str| offered.iter().any(|o| o == p);
    if is_offered(spelled) {
        return Some(spelled.to_string());
    }
    [
        das_api::legacy_profile_name(spelled),
        spelled.replace('-', "."),
    ]
    .into_iter()
    .find(|alias| is_offered(alias))
}

/// The profile a DeviceClass named `name` offers (`1g.10gb.mig.das.com` → `1g.10gb`); `None` for
/// the catch-all class `mig.das.com` and for classes of other drivers.
pub fn offered_profile(class_name: &str) -> Option<String> {
    let p = class_name.strip_suffix(&format!(".{DRIVER_NAME}"))?;
    (!p.is_empty()).then(|| p.to_string())
}

/// Every init and regular container with its legacy requests, validated against the cluster.
/// All problems are gathered so one denial names them all.
fn collect_requests(pod: &Pod, offered: &Offered) -> Result<Vec<LegacyRequest>, Denial> {
    let mut problems = Vec::new();
    let mut out = Vec::new();
    for c in containers(pod) {
        for spelled in legacy_profiles(c) {
            match check_request(pod, c, &spelled, offered) {
                Ok((profile, count)) => out.push(LegacyRequest {
                    container: c.name.clone(),
                    profile,
                    spelled,
                    count,
                    whole_gpu: false,
                }),
                Err(p) => problems.push(p),
            }
        }
        if let Some(whole) = &offered.whole_gpus
            && whole_gpu::asks(c)
        {
            match whole_gpu::check_request(pod, c, whole) {
                Ok(count) => out.push(whole_gpu::request(c, count)),
                Err(p) => problems.push(p),
            }
        }
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(Denial { problems })
    }
}

/// Init containers first, then regular containers (ephemeral containers cannot hold claims).
fn containers(pod: &Pod) -> impl Iterator<Item = &Container> {
    let spec = pod.spec.as_ref();
    let init = spec
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or(&[]);
    let regular = spec.map(|s| s.containers.as_slice()).unwrap_or(&[]);
    init.iter().chain(regular)
}

/// Every distinct profile the pod's containers ask for through `nvidia.com/mig-*` (what the
/// offered-profile cache must know about).
pub fn requested_profiles(pod: &Pod) -> Vec<String> {
    let all: BTreeSet<String> = containers(pod).flat_map(legacy_profiles).collect();
    all.into_iter().collect()
}

/// What the offered-profile cache must know about to translate `pod` ([`offers`]): its
/// [`requested_profiles`], and [`LEGACY_WHOLE_GPU_RESOURCE`] when `whole_gpus` (the webhook
/// translates them) and a container asks for `nvidia.com/gpu`. Empty: nothing to translate.
pub fn wanted(pod: &Pod, whole_gpus: bool) -> Vec<String> {
    let mut out = requested_profiles(pod);
    if whole_gpus && containers(pod).any(whole_gpu::asks) {
        out.push(LEGACY_WHOLE_GPU_RESOURCE.to_string());
    }
    out
}

/// The distinct profiles named by `nvidia.com/mig-*` keys in a container's limits or requests.
fn legacy_profiles(c: &Container) -> BTreeSet<String> {
    let r = c.resources.as_ref();
    let limits = r.and_then(|r| r.limits.as_ref()).into_iter().flatten();
    let requests = r.and_then(|r| r.requests.as_ref()).into_iter().flatten();
    limits
        .chain(requests)
        .filter_map(|(k, _)| k.strip_prefix(LEGACY_RESOURCE_PREFIX))
        .map(str::to_string)
        .collect()
}

/// Validates one request of container `c` for resource suffix `spelled`; returns the offered
/// profile it means and its count, or the problem.
fn check_request(
    pod: &Pod,
    c: &Container,
    spelled: &str,
    offered: &Offered,
) -> Result<(String, u32), String> {
    let key = format!("{LEGACY_RESOURCE_PREFIX}{spelled}");
    let who = format!("container {:?}: {key}", c.name);
    let Some(profile) = resolve_profile(spelled, &offered.profiles) else {
        return Err(format!(
            "{who}: unknown MIG profile {spelled:?}; this cluster offers {}",
            offered_list(&offered.profiles)
        ));
    };
    let profile = profile.as_str();
    let count = count_of(c, &key, &who, "MIG slices", "slices")?;
    let max = offered
        .max_per_node
        .get(profile)
        .copied()
        .unwrap_or(MAX_DEVICES_PER_CLAIM)
        .min(MAX_DEVICES_PER_CLAIM);
    if count > max {
        return Err(format!(
            "{who}: {count} slices cannot be allocated to one pod; at most {max} {profile} slices fit on one node of this cluster (and a claim holds at most {MAX_DEVICES_PER_CLAIM} devices)"
        ));
    }
    if let Some(claim) = das_claim_for(pod, c, profile) {
        return Err(format!(
            "{who}: the container already holds DAS claim {claim:?} for profile {profile}; \
             ask for the slices either through {key} or through the claim, not both"
        ));
    }
    Ok((profile.to_string(), count))
}

/// The count container `c` asks for of resource `key` (limits, else requests; equal if both);
/// `who` starts the problem, `things` (`MIG slices`) and `unit` (`slices`) name what is asked.
fn count_of(c: &Container, key: &str, who: &str, things: &str, unit: &str) -> Result<u32, String> {
    let r = c.resources.as_ref();
    let limit = r.and_then(|r| r.limits.as_ref()?.get(key));
    let request = r.and_then(|r| r.requests.as_ref()?.get(key));
    if let (Some(l), Some(q)) = (limit, request)
        && l.0.trim() != q.0.trim()
    {
        return Err(format!(
            "{who}: requests ({}) and limits ({}) differ; {things} cannot be overcommitted, set them equal",
            q.0, l.0
        ));
    }
    let qty = limit
        .or(request)
        .ok_or_else(|| format!("{who}: neither limits nor requests name it"))?;
    parse_count(qty).ok_or_else(|| {
        format!(
            "{who}: quantity {:?} is not a positive integer; ask for a whole number of {unit}, e.g. 1 or 2",
            qty.0
        )
    })
}

/// `"1"`, `"3"`: plain decimal integers ≥ 1. Suffixes, fractions, exponents and zero are refused;
/// a number too large for 32 bits counts as `u32::MAX` (refused later, with the maximum).
fn parse_count(q: &Quantity) -> Option<u32> {
    let s = q.0.trim();
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let digits = s.trim_start_matches('0');
    if digits.is_empty() {
        return None;
    }
    Some(digits.parse::<u32>().unwrap_or(u32::MAX))
}

/// Offered profiles for a message: `1g.10gb, 2g.20gb` or `none (no <profile>.mig.das.com DeviceClass)`.
fn offered_list(offered: &[String]) -> String {
    if offered.is_empty() {
        return format!("none (no <profile>.{DRIVER_NAME} DeviceClass exists)");
    }
    let mut v: Vec<&str> = offered.iter().map(String::as_str).collect();
    v.sort_unstable();
    v.dedup();
    v.join(", ")
}

/// The name of a pod claim used by `c` that comes from a DAS template for `profile`, if any.
fn das_claim_for(pod: &Pod, c: &Container, profile: &str) -> Option<String> {
    das_claim_from(
        pod,
        c,
        &format!("{TEMPLATE_PREFIX}{}-x", profile_dns_label(profile)),
    )
}

/// The name of a pod claim used by `c` whose template's name starts with `prefix`, if any.
fn das_claim_from(pod: &Pod, c: &Container, prefix: &str) -> Option<String> {
    let used: BTreeSet<&str> = c
        .resources
        .as_ref()
        .and_then(|r| r.claims.as_ref())
        .into_iter()
        .flatten()
        .map(|rc| rc.name.as_str())
        .collect();
    existing_claims(pod)
        .filter(|pc| used.contains(pc.name.as_str()))
        .find(|pc| {
            pc.resource_claim_template_name
                .as_deref()
                .is_some_and(|t| t.starts_with(prefix))
        })
        .map(|pc| pc.name.clone())
}

fn existing_claims(pod: &Pod) -> impl Iterator<Item = &PodResourceClaim> {
    pod.spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_ref())
        .into_iter()
        .flatten()
}

/// Adds pod claim `claim` (from `template`) and the container's reference to it.
fn add_claim(pod: &mut Pod, r: &LegacyRequest, claim: &str, template: &str) {
    let spec = pod.spec.get_or_insert_with(Default::default);
    spec.resource_claims
        .get_or_insert_with(Vec::new)
        .push(PodResourceClaim {
            name: claim.to_string(),
            resource_claim_template_name: Some(template.to_string()),
            ..Default::default()
        });
    let init = spec.init_containers.iter_mut().flatten();
    if let Some(c) = init
        .chain(spec.containers.iter_mut())
        .find(|c| c.name == r.container)
    {
        c.resources
            .get_or_insert_with(Default::default)
            .claims
            .get_or_insert_with(Vec::new)
            .push(ResourceClaim {
                name: claim.to_string(),
                ..Default::default()
            });
    }
}

/// Removes every `nvidia.com/mig-*` entry (and `nvidia.com/gpu` with `whole_gpus`) from every
/// container's requests and limits; a map left empty is dropped.
fn strip_legacy(pod: &mut Pod, whole_gpus: bool) {
    let Some(spec) = pod.spec.as_mut() else {
        return;
    };
    let init = spec.init_containers.iter_mut().flatten();
    for c in init.chain(spec.containers.iter_mut()) {
        let Some(r) = c.resources.as_mut() else {
            continue;
        };
        for map in [&mut r.limits, &mut r.requests] {
            if let Some(m) = map.as_mut() {
                m.retain(|k, _| {
                    let legacy = k.starts_with(LEGACY_RESOURCE_PREFIX)
                        || (whole_gpus && k == LEGACY_WHOLE_GPU_RESOURCE);
                    !legacy
                });
                if m.is_empty() {
                    *map = None;
                }
            }
        }
    }
}

/// Records `translated` in [`TRANSLATION_ANNOTATION`].
fn annotate(pod: &mut Pod, translated: &[Translated]) {
    let value = serde_json::to_string(translated).expect("plain data serializes");
    pod.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(TRANSLATION_ANNOTATION.to_string(), value);
}

/// One template per distinct (profile, count), in name order (whole GPUs last).
fn templates_for(requests: &[LegacyRequest]) -> Vec<ResourceClaimTemplate> {
    let distinct: BTreeSet<(bool, String, u32)> = requests
        .iter()
        .map(|r| (r.whole_gpu, r.profile.clone(), r.count))
        .collect();
    distinct
        .iter()
        .map(|(whole, p, n)| {
            if *whole {
                whole_gpu_template(*n)
            } else {
                template(p, *n)
            }
        })
        .collect()
}

#[cfg(test)]
mod tests;
