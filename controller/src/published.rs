//! What the controller keeps of each DAS ResourceSlice: its name, its pool and, of each device,
//! the facts an AllocationClaim needs ([`crate::mirror::facts_of`]: name, profile, parent GPU
//! UUID, placement, DAS health taints). Nothing else: no capacities, counter consumptions (of
//! which only the number of `memory-slice-<n>` counters is read while decoding, the placement of
//! a whole GPU), other attributes, other taints, managed fields, labels or annotations.
//!
//! A [`PublishedSlice`] is decoded straight from the API server's JSON (list pages and watch
//! events) into this form, so the full object never sits in the reflector's store: at 1000 nodes
//! × 8 H100 (200,000 devices) the full objects take 1 GiB, this form 21 MiB, about 110 bytes a
//! device (docs/benchmarks.md, "Memory with many published devices"). Profile and GPU UUID
//! strings and the health are shared between the devices of a slice.

use std::borrow::Cow;
use std::sync::Arc;

use das_api::DRIVER_NAME;
use das_api::allocation::MigPlacement;
use k8s_openapi::api::resource::v1::{DeviceTaint, ResourceSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::ClusterResourceScope;
use serde::Deserialize;

use crate::mirror::{
    Attributes, DeviceFacts, DeviceHealth, DeviceIndex, facts_of, is_memory_slice,
};

/// Items per page of the initial list of ResourceSlices (`watcher::Config::page_size`). A DAS
/// slice of 64 devices is about 50 kB of JSON (more with managed fields); kube-runtime's default
/// of 500 would hold about 25 MB of text per page at once.
pub const SLICE_PAGE_SIZE: u32 = 50;

/// A DAS ResourceSlice as the controller keeps it (see the module docs). Decodes from a
/// ResourceSlice's JSON; [`From<&ResourceSlice>`] gives the same value from a decoded object.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(from = "wire::Slice")]
pub struct PublishedSlice {
    /// `name`, `uid` and `resourceVersion` only (what the reflector's store keys on).
    metadata: ObjectMeta,
    /// `spec.pool.name`: the node's pool (docs/design.md §3).
    pub pool: String,
    /// Devices with every fact an AllocationClaim needs, in slice order; devices that lack one
    /// are left out (the mirror never indexed them), as are all devices of another driver.
    pub devices: Vec<PublishedDevice>,
}

/// One device of a [`PublishedSlice`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedDevice {
    /// Device name (`spec.devices[].name`).
    pub name: Box<str>,
    /// `profile` attribute, e.g. `1g.10gb` (`gpu` for a whole GPU); shared by the slice's devices
    /// of that profile.
    pub profile: Arc<str>,
    /// `parentUUID` attribute (`uuid` of a whole GPU); shared by the slice's devices of that GPU.
    pub gpu_uuid: Arc<str>,
    /// `placementStart`, `placementSize` attributes (`{0, N}` over a whole GPU's N memory
    /// slices).
    pub placement: MigPlacement,
    /// From the DAS health taints; shared by the slice's devices of the same health.
    pub health: Arc<DeviceHealth>,
}

impl PublishedDevice {
    /// The facts the mirror takes from this device.
    pub fn facts(&self) -> DeviceFacts {
        DeviceFacts {
            profile: self.profile.to_string(),
            gpu_uuid: self.gpu_uuid.to_string(),
            placement: self.placement,
            health: Some((*self.health).clone()),
        }
    }
}

impl PublishedSlice {
    /// Builds the kept form from the slice's name fields, driver, pool and each device's name,
    /// attributes, taints and number of consumed memory-slice counters (both decoding paths go
    /// through here).
    fn build<'a>(
        metadata: ObjectMeta,
        driver: &str,
        pool: String,
        devices: impl IntoIterator<Item = DeviceParts<'a>>,
    ) -> Self {
        let mut shared = Interner::default();
        let mut devices: Vec<PublishedDevice> = if driver == DRIVER_NAME {
            devices
                .into_iter()
                .filter_map(|(name, attrs, taints, memory_slices)| {
                    let f = facts_of(attrs, taints, memory_slices)?;
                    Some(PublishedDevice {
                        name: name.into(),
                        profile: shared.string(&f.profile),
                        gpu_uuid: shared.string(&f.gpu_uuid),
                        placement: f.placement,
                        health: shared.health(f.health.unwrap_or(DeviceHealth::Healthy)),
                    })
                })
                .collect()
        } else {
            Vec::new()
        };
        devices.shrink_to_fit();
        Self {
            metadata,
            pool,
            devices,
        }
    }
}

/// What [`PublishedSlice::build`] reads of a device: its name, attributes, taints and the number
/// of `memory-slice-<n>` counters it consumes.
type DeviceParts<'a> = (
    &'a str,
    Option<&'a Attributes>,
    Option<&'a [DeviceTaint]>,
    u32,
);

impl From<&ResourceSlice> for PublishedSlice {
    fn from(s: &ResourceSlice) -> Self {
        let m = &s.metadata;
        Self::build(
            kept_metadata(m.name.clone(), m.uid.clone(), m.resource_version.clone()),
            &s.spec.driver,
            s.spec.pool.name.clone(),
            s.spec.devices.iter().flatten().map(|d| {
                let slices = d
                    .consumes_counters
                    .iter()
                    .flatten()
                    .flat_map(|c| c.counters.keys())
                    .filter(|k| is_memory_slice(k))
                    .count();
                (
                    d.name.as_str(),
                    d.attributes.as_ref(),
                    d.taints.as_deref(),
                    u32::try_from(slices).unwrap_or(u32::MAX),
                )
            }),
        )
    }
}

fn kept_metadata(
    name: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
) -> ObjectMeta {
    ObjectMeta {
        name,
        uid,
        resource_version,
        ..ObjectMeta::default()
    }
}

/// The device index of the mirror over the kept slices (what
/// [`DeviceIndex::from_slices`] gives over the full ones).
pub fn device_index<'a>(slices: impl IntoIterator<Item = &'a PublishedSlice>) -> DeviceIndex {
    DeviceIndex::from_facts(slices.into_iter().flat_map(|s| {
        s.devices
            .iter()
            .map(|d| ((s.pool.clone(), d.name.to_string()), d.facts()))
    }))
}

/// Shares equal strings and healths between the devices of one slice.
#[derive(Default)]
struct Interner {
    strings: Vec<Arc<str>>,
    healths: Vec<Arc<DeviceHealth>>,
}

impl Interner {
    fn string(&mut self, s: &str) -> Arc<str> {
        if let Some(a) = self.strings.iter().find(|a| ***a == *s) {
            return a.clone();
        }
        let a: Arc<str> = s.into();
        self.strings.push(a.clone());
        a
    }

    fn health(&mut self, h: DeviceHealth) -> Arc<DeviceHealth> {
        if let Some(a) = self.healths.iter().find(|a| ***a == h) {
            return a.clone();
        }
        let a = Arc::new(h);
        self.healths.push(a.clone());
        a
    }
}

impl kube::Resource for PublishedSlice {
    type DynamicType = ();
    type Scope = ClusterResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        <ResourceSlice as k8s_openapi::Resource>::KIND.into()
    }

    fn group(_: &()) -> Cow<'_, str> {
        <ResourceSlice as k8s_openapi::Resource>::GROUP.into()
    }

    fn version(_: &()) -> Cow<'_, str> {
        <ResourceSlice as k8s_openapi::Resource>::VERSION.into()
    }

    fn api_version(_: &()) -> Cow<'_, str> {
        <ResourceSlice as k8s_openapi::Resource>::API_VERSION.into()
    }

    fn plural(_: &()) -> Cow<'_, str> {
        <ResourceSlice as k8s_openapi::Resource>::URL_PATH_SEGMENT.into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The parts of a ResourceSlice's JSON that are decoded at all; serde skips every other field
/// without building it.
mod wire {
    use super::*;

    #[derive(Deserialize)]
    pub struct Slice {
        #[serde(default)]
        metadata: Meta,
        spec: Spec,
    }

    #[derive(Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Meta {
        name: Option<String>,
        uid: Option<String>,
        resource_version: Option<String>,
    }

    #[derive(Deserialize)]
    struct Spec {
        driver: String,
        pool: Pool,
        #[serde(default)]
        devices: Option<Vec<Device>>,
    }

    #[derive(Deserialize)]
    struct Pool {
        name: String,
    }

    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Device {
        name: String,
        #[serde(default)]
        attributes: Option<Attributes>,
        #[serde(default)]
        taints: Option<Vec<DeviceTaint>>,
        #[serde(default)]
        consumes_counters: Option<Vec<Consumption>>,
    }

    /// A device's consumption from one counter set: only how many of its counters are memory
    /// slices (the placement of a whole GPU).
    #[derive(Deserialize)]
    struct Consumption {
        #[serde(default)]
        counters: MemorySlices,
    }

    /// The number of `memory-slice-<n>` keys of a `counters` map; keys are looked at in place
    /// and values skipped, nothing is kept.
    #[derive(Default)]
    struct MemorySlices(u32);

    impl<'de> Deserialize<'de> for MemorySlices {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            d.deserialize_map(CountMemorySlices)
        }
    }

    struct CountMemorySlices;

    impl<'de> serde::de::Visitor<'de> for CountMemorySlices {
        type Value = MemorySlices;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a map of counters")
        }

        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut map: A,
        ) -> Result<MemorySlices, A::Error> {
            let mut n = 0u32;
            while let Some(IsMemorySlice(yes)) = map.next_key()? {
                map.next_value::<serde::de::IgnoredAny>()?;
                n = n.saturating_add(u32::from(yes));
            }
            Ok(MemorySlices(n))
        }
    }

    /// Whether a counter name is a memory slice's, read without copying the name.
    struct IsMemorySlice(bool);

    impl<'de> Deserialize<'de> for IsMemorySlice {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct Name;
            impl serde::de::Visitor<'_> for Name {
                type Value = IsMemorySlice;

                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("a counter name")
                }

                fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<IsMemorySlice, E> {
                    Ok(IsMemorySlice(is_memory_slice(v)))
                }
            }
            d.deserialize_str(Name)
        }
    }

    impl From<Slice> for PublishedSlice {
        fn from(s: Slice) -> Self {
            let Meta {
                name,
                uid,
                resource_version,
            } = s.metadata;
            PublishedSlice::build(
                kept_metadata(name, uid, resource_version),
                &s.spec.driver,
                s.spec.pool.name,
                s.spec.devices.iter().flatten().map(|d| {
                    let slices = d
                        .consumes_counters
                        .iter()
                        .flatten()
                        .fold(0u32, |n, c| n.saturating_add(c.counters.0));
                    (
                        d.name.as_str(),
                        d.attributes.as_ref(),
                        d.taints.as_deref(),
                        slices,
                    )
                }),
            )
        }
    }
}

#[cfg(test)]
mod tests;
