//! What every DAS component and the Kubernetes objects around them agree on.
//!
//! - this module: the names of docs/design.md §3 (driver, DeviceClasses, device names, attribute,
//!   capacity and counter names). Changing one breaks clusters that already run DAS
//!   (ResourceSlices, DeviceClasses, CDI specs and AllocationClaims carry them).
//! - [`allocation`]: the AllocationClaim custom resource (docs/design.md §6).
//! - [`claim_status`]: the node plugin's entries in a ResourceClaim's `status.devices`, which the
//!   controller reads, and the accessor for our driver's allocation results (docs/design.md §7).

// Product functions stay under 80 code lines (clippy.toml); tests may be longer.
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

pub mod allocation;
pub mod claim_status;
pub mod device_config;

/// The DRA driver name: `ResourceSlice.spec.driver`, `DeviceClass` selectors, allocation results.
pub const DRIVER_NAME: &str = "mig.das.com";

/// The DeviceClass that selects every MIG slice DAS publishes (devices whose `type` is
/// [`attributes::TYPE_MIG`]).
pub const DEVICE_CLASS_ALL: &str = DRIVER_NAME;
/// The DeviceClass that selects whole GPUs (devices whose `type` is
/// [`attributes::TYPE_GPU`]; docs/design.md §7, "Whole GPUs").
pub const DEVICE_CLASS_WHOLE_GPU: &str = "gpu.das.com";
/// The `profile` an AllocationClaim, a checkpoint record and `kubectl das` show for a whole GPU
/// (never a MIG profile name: those look like `1g.10gb`).
pub const WHOLE_GPU_PROFILE: &str = "gpu";
/// The legacy device-plugin resource of whole GPUs the webhook may translate
/// (`webhook.translateWholeGpus`).
pub const LEGACY_WHOLE_GPU_RESOURCE: &str = "nvidia.com/gpu";

/// Namespace of a Helm install.
pub const INSTALL_NAMESPACE: &str = "das-system";

/// CDI kind (`<vendor>/<class>`) of the specs DAS writes, one per claim.
pub const CDI_KIND: &str = "das.com/mig";

/// Prefix of the legacy device-plugin resource names the webhook translates,
/// e.g. `nvidia.com/mig-1g.10gb`.
pub const LEGACY_RESOURCE_PREFIX: &str = "nvidia.com/mig-";

/// A GPU-instance profile as NVIDIA's device plugin names it in its extended resources
/// (`nvidia.com/mig-<this>`): `+` becomes `.` (`1g.10gb+me` → `1g.10gb.me`; k8s-device-plugin
/// `internal/rm/rm.go`: `strings.ReplaceAll("mig-"+p.String(), "+", ".")`). Blackwell's real
/// `-me` profiles (`1g.24gb-me`) keep their `-`, so `+me` and `-me` never meet.
pub fn legacy_profile_name(profile: &str) -> String {
    profile.replace('+', ".")
}

/// Name of the per-profile DeviceClass: `<profile as NVIDIA names it>.mig.das.com`
/// ([`legacy_profile_name`]): `1g.10gb.mig.das.com`, `1g.10gb.me.mig.das.com` for `1g.10gb+me`,
/// `1g.24gb-me.mig.das.com` for `1g.24gb-me`. A valid DNS subdomain for every known profile,
/// and distinct per profile (a test checks every GPU model's profiles).
pub fn profile_device_class(profile: &str) -> String {
    legacy_class(&legacy_profile_name(profile))
}

/// The DeviceClass that serves `nvidia.com/mig-<legacy>`: `<legacy>.mig.das.com`.
pub fn legacy_class(legacy: &str) -> String {
    format!("{legacy}.{DRIVER_NAME}")
}

/// A GPU-instance profile name as a DNS label fragment, as used in device names: lower case,
/// `-` doubled, every other character outside `[a-z0-9]` becomes `-`: `1g.10gb+me` →
/// `1g-10gb-me`, `1g.24gb-me` → `1g-24gb--me` (so `+me` and `-me` profiles get distinct names).
pub fn profile_dns_label(profile: &str) -> String {
    let mut out = String::with_capacity(profile.len() + 2);
    for c in profile.chars() {
        let c = c.to_ascii_lowercase();
        match c {
            'a'..='z' | '0'..='9' => out.push(c),
            '-' => out.push_str("--"),
            _ => out.push('-'),
        }
    }
    out
}

/// Name of the published whole-GPU device of GPU `gpu_index`: `gpu-<index>`, e.g. `gpu-3`
/// (never the prefix of a MIG device's name followed by a digit: those continue `-mig-`).
pub fn whole_gpu_device_name(gpu_index: u32) -> String {
    format!("gpu-{gpu_index}")
}

/// Name of the published device for `profile` at memory slice `start` of GPU `gpu_index`:
/// `gpu-<index>-mig-<profile as DNS label>-<start>`, e.g. `gpu-3-mig-1g-10gb-me-6`. The
/// AllocationClaim `spec.device` and the plugin's checkpoint carry it.
pub fn device_name(gpu_index: u32, profile: &str, start: u32) -> String {
    format!("gpu-{gpu_index}-mig-{}-{start}", profile_dns_label(profile))
}

/// Name of the shareable device for `profile` at memory slice `start` of GPU `gpu_index`
/// (docs/design.md §7, "Shared slices"): the exclusive device's name ([`device_name`]) with
/// `-shared`, e.g. `gpu-3-mig-1g-10gb-6-shared`. It consumes the same counters as the exclusive
/// device, so the two never hold one placement at once.
pub fn shared_device_name(gpu_index: u32, profile: &str, start: u32) -> String {
    format!("{}-shared", device_name(gpu_index, profile, start))
}

/// Name of the shareable device of whole GPU `gpu_index` (docs/design.md §7, "Memory slices of
/// a whole GPU"): `gpu-<index>-shared`, e.g. `gpu-3-shared`. It consumes every counter of its
/// GPU, as the whole GPU's device does, so MIG use, whole use and shared use of one GPU exclude
/// each other.
pub fn shared_whole_gpu_device_name(gpu_index: u32) -> String {
    format!("{}-shared", whole_gpu_device_name(gpu_index))
}

/// The DeviceClass of the shareable devices of whole GPUs: `gpu.shared.mig.das.com` (the shared
/// class of the whole-GPU profile [`WHOLE_GPU_PROFILE`], so das-webhook's tenant selector, which
/// every `*.shared.mig.das.com` class gets, covers it too).
pub fn shared_whole_gpu_device_class() -> String {
    shared_profile_device_class(WHOLE_GPU_PROFILE)
}

/// The DeviceClass of the shareable devices of `profile`: `<legacy name>.shared.mig.das.com`,
/// e.g. `1g.10gb.shared.mig.das.com` (docs/design.md §3).
pub fn shared_profile_device_class(profile: &str) -> String {
    format!("{}.shared.{DRIVER_NAME}", legacy_profile_name(profile))
}

/// Device attribute names DAS publishes on its devices (docs/design.md §3). Names without a domain
/// are in the driver's domain ([`DRIVER_NAME`]): in CEL, `device.attributes["mig.das.com"].profile`.
/// Where NVIDIA's DRA driver publishes the same fact, DAS uses its unqualified name (`uuid`,
/// `parentUUID`, `profile`, `productName`, `brand`, `architecture`, `cudaComputeCapability`,
/// `driverVersion`, `cudaDriverVersion`), so a selector written against those names keeps
/// working once the driver name in it is changed.
pub mod attributes {
    /// `type` (string): [`TYPE_MIG`] on a MIG device, [`TYPE_GPU`] on a whole GPU (the values
    /// NVIDIA's DRA driver uses for the same two kinds).
    pub const TYPE: &str = "type";
    /// Value of [`TYPE`] on every MIG device.
    pub const TYPE_MIG: &str = "mig";
    /// Value of [`TYPE`] on a whole-GPU device.
    pub const TYPE_GPU: &str = "gpu";
    /// `type` of a shareable MIG device (several claims, each a share of one slice; KEP-5075):
    /// a value of its own, so that the classes that select `type == "mig"` never hand one to an
    /// exclusive claim.
    pub const TYPE_MIG_SHARED: &str = "mig-shared";
    /// `type` of the shareable device of a whole GPU (memory slices of a GPU with MIG mode off
    /// or without MIG, shared through MPS; docs/design.md §7, "Memory slices of a whole GPU").
    pub const TYPE_GPU_SHARED: &str = "gpu-shared";

    /// Whether `type` value `t` is a device of a whole GPU ([`TYPE_GPU`], or its shareable twin
    /// [`TYPE_GPU_SHARED`]): it carries the GPU's `uuid`, no profile or placement.
    pub fn is_whole_gpu_type(t: &str) -> bool {
        t == TYPE_GPU || t == TYPE_GPU_SHARED
    }

    /// Whether `type` value `t` is a shareable device's ([`TYPE_MIG_SHARED`],
    /// [`TYPE_GPU_SHARED`]).
    pub fn is_shared_type(t: &str) -> bool {
        t == TYPE_MIG_SHARED || t == TYPE_GPU_SHARED
    }
    /// `memoryEnforcement` (string), on the shareable device of a whole GPU: who holds each
    /// share to its `memory` — [`MEMORY_ENFORCEMENT_ENFORCED`] or [`MEMORY_ENFORCEMENT_MPS`]. A
    /// claim that needs a hard limit selects
    /// `device.attributes["mig.das.com"].memoryEnforcement == "enforced"`.
    pub const MEMORY_ENFORCEMENT: &str = "memoryEnforcement";
    /// The kernel holds each container to its share's memory: the GPU's memory is a cgroup v2
    /// `dmem` region (NVIDIA driver r615+, Linux 6.14+) and DAS sets the container's hard limit
    /// (`dmem.max`); an allocation past it fails with out-of-memory, whatever the client does.
    pub const MEMORY_ENFORCEMENT_ENFORCED: &str = "enforced";
    /// Only the MPS server holds each share to its memory (its pinned device memory limit): a
    /// client of the share's MPS namespace (protocol 3) or environment (protocol 2) cannot pass
    /// it through MPS, but the limit is the server's, not the kernel's (docs/design.md §7).
    pub const MEMORY_ENFORCEMENT_MPS: &str = "mps";
    /// `uuid` (string): on a whole GPU, its UUID `GPU-xxxxxxxx-...` (`nvmlDeviceGetUUID`; NVIDIA's
    /// DRA driver's name for it; a MIG device carries its GPU's as [`PARENT_UUID`], and no
    /// `uuid` of its own: a placement has no MIG UUID before it is prepared).
    pub const UUID: &str = "uuid";
    /// `profile` (string): the GPU-instance profile name as NVML prints it, e.g. `1g.10gb+me`.
    pub const PROFILE: &str = "profile";
    /// `parentUUID` (string): UUID of the physical GPU, `GPU-xxxxxxxx-...`.
    pub const PARENT_UUID: &str = "parentUUID";
    /// `gpuIndex` (int): index of the physical GPU on its node.
    pub const GPU_INDEX: &str = "gpuIndex";
    /// `placementStart` (int): first memory slice of the placement.
    pub const PLACEMENT_START: &str = "placementStart";
    /// `placementSize` (int): number of memory slices of the placement.
    pub const PLACEMENT_SIZE: &str = "placementSize";
    /// `productName` (string): the GPU's product name as NVML reports it (`nvmlDeviceGetName`),
    /// e.g. `NVIDIA H100 80GB HBM3`.
    pub const PRODUCT_NAME: &str = "productName";
    /// `architecture` (string): `Turing`, `Ampere`, `Ada Lovelace`, `Hopper`, `Blackwell`, ...
    /// (the model data file's, or `nvmlDeviceGetArchitecture` for a GPU without one; NVIDIA's
    /// DRA driver's spelling, go-nvlib `GetArchitectureAsString`).
    pub const ARCHITECTURE: &str = "architecture";
    /// `cudaComputeCapability` (version, semver), e.g. `9.0.0` (the model data file's, or
    /// `nvmlDeviceGetCudaComputeCapability` for a GPU without one).
    pub const CUDA_COMPUTE_CAPABILITY: &str = "cudaComputeCapability";
    /// `driverVersion` (version, semver), e.g. `580.95.5` for driver `580.95.05`
    /// (`nvmlSystemGetDriverVersion`).
    pub const DRIVER_VERSION: &str = "driverVersion";
    /// `brand` (string): the GPU's brand (`nvmlDeviceGetBrand`) named as NVIDIA's DRA driver
    /// names it (go-nvlib `GetBrandAsString`): `Nvidia` on current data-center GPUs, else
    /// `Tesla`, `Quadro`, `GeForce`, `NvidiaRTX`, ...; omitted when NVML cannot say.
    pub const BRAND: &str = "brand";
    /// `cudaDriverVersion` (version, semver): the newest CUDA version the driver supports
    /// (`nvmlSystemGetCudaDriverVersion_v2`, `12090` → `12.9.0`, as NVIDIA's DRA driver
    /// formats it: major and minor, patch 0); omitted when NVML cannot say.
    pub const CUDA_DRIVER_VERSION: &str = "cudaDriverVersion";
    /// The standard PCI bus ID attribute (string, `<domain>:<bus>:<device>.<function>` in lower
    /// case with a 4-digit domain, e.g. `0000:3b:00.0`; NVML's `00000000:3B:00.0` normalised as
    /// Kubernetes' `deviceattribute.GetPCIBusIDAttribute` requires), published only where the
    /// bus ID is known and of that form.
    pub const PCI_BUS_ID: &str = "resource.kubernetes.io/pciBusID";
    /// The standard PCIe root attribute (string, `pci<domain>:<bus>`, e.g. `pci0000:00`): the
    /// PCIe root complex the GPU hangs off, the first directory under `/sys/devices` of the
    /// GPU's sysfs path (`/sys/bus/pci/devices/<bus id>` resolved), as Kubernetes'
    /// `deviceattribute.GetPCIeRootAttributeByPCIBusID` (KEP-5491) computes it. Devices of
    /// different drivers with equal values share a root complex: a claim aligns a GPU with a NIC
    /// by `matchAttribute: resource.kubernetes.io/pcieRoot`. Published only where sysfs tells.
    pub const PCIE_ROOT: &str = "resource.kubernetes.io/pcieRoot";
    /// The standard NUMA node attribute (int): the NUMA node of the GPU's PCI device, the
    /// kernel's `/sys/bus/pci/devices/<bus id>/numa_node`, as Kubernetes'
    /// `deviceattribute.GetNUMANodeAttributeByPCIBusID` reads it (its scalar form). Devices of
    /// different drivers with equal values sit on one NUMA node: a claim aligns a GPU with a NIC
    /// or CPUs by `matchAttribute: resource.kubernetes.io/numaNode`. Published only where sysfs
    /// tells one (never `-1`, which would match every other device without one).
    pub const NUMA_NODE: &str = "resource.kubernetes.io/numaNode";
    /// `shareNamespace` (string), on a shareable device ([`TYPE_MIG_SHARED`]) while claims hold
    /// shares of its slice: the namespace of those claims, or [`SHARE_NAMESPACE_SEVERAL`] when
    /// claims of several namespaces hold it (docs/design.md §7, "Shares are a tenant's own").
    /// Absent while no claim holds a share, and never published where cross-namespace sharing
    /// is on (`--shares-across-namespaces`). Not `namespace`: that is a reserved word of CEL,
    /// so `device.attributes["mig.das.com"].namespace` would not compile.
    pub const SHARE_NAMESPACE: &str = "shareNamespace";
    /// Value of [`SHARE_NAMESPACE`] on a slice that claims of several namespaces hold (shares
    /// made before cross-namespace sharing was turned off): no namespace has this name (a
    /// namespace is a DNS label), so no further share from any namespace is steered to it.
    pub const SHARE_NAMESPACE_SEVERAL: &str = "<several>";
}

/// The CEL selector das-webhook adds to every request of a ResourceClaim in `namespace` for a
/// shared class (docs/design.md §8, "Shares stay in their namespace"): a shareable device is
/// allocated only while no claim holds a share of it or the claims of `namespace` do. Reads
/// the attribute with `in` first, since a lookup of an attribute a device lacks is an
/// evaluation error that aborts the allocation. `namespace` must be a DNS label (every
/// namespace is), so it needs no escaping in the CEL string literal.
pub fn share_namespace_selector(namespace: &str) -> String {
    let attr = attributes::SHARE_NAMESPACE;
    format!(
        "!(\"{attr}\" in device.attributes[\"{DRIVER_NAME}\"]) || device.attributes[\"{DRIVER_NAME}\"].{attr} == \"{namespace}\""
    )
}

/// Device capacity names DAS publishes on every MIG device (docs/design.md §3).
pub mod capacities {
    /// `memory`: the profile's memory, in bytes.
    pub const MEMORY: &str = "memory";
    /// `multiprocessors`: streaming multiprocessors (SMs) of the profile.
    pub const MULTIPROCESSORS: &str = "multiprocessors";
    /// `copyEngines`: copy engines (CE).
    pub const COPY_ENGINES: &str = "copyEngines";
    /// `decoders`: video decoders (NVDEC).
    pub const DECODERS: &str = "decoders";
    /// `encoders`: video encoders (NVENC).
    pub const ENCODERS: &str = "encoders";
    /// `jpegEngines`: JPEG decoders (NVJPG).
    pub const JPEG_ENGINES: &str = "jpegEngines";
    /// `ofaEngines`: optical-flow accelerators (OFA).
    pub const OFA_ENGINES: &str = "ofaEngines";
    /// `shares`: on a shareable device, how many equal shares of the slice's compute it has; a
    /// claim consumes 1 unless it asks for more (docs/design.md §7, "Shared slices").
    pub const SHARES: &str = "shares";
    /// The step of a shareable device's `memory` (its request policy's `validRange.step` and
    /// `min`), in bytes: 256 MiB. A share's memory is a whole number of steps.
    pub const MEMORY_STEP_BYTES: u64 = 256 << 20;
    /// The most `shares` a shareable device may have (`--shares-per-slice`, chart
    /// `sharing.sharesPerSlice`).
    pub const MAX_SHARES: u64 = 64;
}

/// Keys of the device taints the node plugin puts on every device of an unhealthy GPU
/// (docs/design.md §3 and §7, "Health"). A claim that should still get such a device tolerates
/// the key (`tolerations` in its device request).
pub mod health_taints {
    /// The GPU does not answer (fell off the bus, removed). Value `true`.
    pub const GPU_LOST: &str = "mig.das.com/gpu-lost";
    /// A fatal XID error. Value: the XID, e.g. `79`.
    pub const XID: &str = "mig.das.com/xid";
    /// An uncorrectable ECC error. Value `uncorrectable`.
    pub const ECC: &str = "mig.das.com/ecc";
}

/// Shared-counter names (docs/design.md §3). Counter names are DNS labels, hence the hyphens; they match
/// the NVIDIA DRA driver's so tools that read them work unchanged.
pub mod counters {
    /// `memory`: memory, in bytes.
    pub const MEMORY: &str = "memory";
    /// `multiprocessors`: streaming multiprocessors.
    pub const MULTIPROCESSORS: &str = "multiprocessors";
    /// `copy-engines`: copy engines.
    pub const COPY_ENGINES: &str = "copy-engines";
    /// `decoders`: video decoders.
    pub const DECODERS: &str = "decoders";
    /// `encoders`: video encoders.
    pub const ENCODERS: &str = "encoders";
    /// `jpeg-engines`: JPEG decoders.
    pub const JPEG_ENGINES: &str = "jpeg-engines";
    /// `ofa-engines`: optical-flow accelerators.
    pub const OFA_ENGINES: &str = "ofa-engines";

    /// Name of the counter set of GPU `gpu_index`: `gpu-<index>-counter-set`.
    pub fn counter_set_name(gpu_index: u32) -> String {
        format!("gpu-{gpu_index}-counter-set")
    }

    /// Name of the counter (value 1) for memory slice `slice`: `memory-slice-<n>`.
    pub fn memory_slice(slice: u32) -> String {
        format!("memory-slice-{slice}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_classes_follow_design_names() {
        assert_eq!(profile_device_class("1g.10gb"), "1g.10gb.mig.das.com");
        assert_eq!(profile_device_class("1g.10gb+me"), "1g.10gb.me.mig.das.com");
        assert_eq!(profile_device_class("1g.24gb-me"), "1g.24gb-me.mig.das.com");
        assert_eq!(legacy_profile_name("1g.24gb+me.all"), "1g.24gb.me.all");
        assert_eq!(profile_dns_label("1g.24gb-me"), "1g-24gb--me");
        assert_eq!(profile_dns_label("1g.24gb+me"), "1g-24gb-me");
    }

    #[test]
    fn device_names_are_dns_labels() {
        assert_eq!(device_name(0, "1g.10gb", 0), "gpu-0-mig-1g-10gb-0");
        assert_eq!(device_name(3, "1g.10gb+me", 6), "gpu-3-mig-1g-10gb-me-6");
        assert_eq!(profile_dns_label("7g.141gb"), "7g-141gb");
    }

    #[test]
    fn counter_names_follow_design() {
        assert_eq!(counters::counter_set_name(3), "gpu-3-counter-set");
        assert_eq!(counters::memory_slice(7), "memory-slice-7");
    }
}
