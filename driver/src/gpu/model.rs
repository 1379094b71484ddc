//! GPU models: the types of the MIG profile and placement tables (facts in
//! docs/reference/mig.md), what a profile consumes, and the models of GPUs without MIG (T4, L4,
//! …: no tables, served whole; docs/reference/gpus-without-mig.md). [`super::catalog`] loads them
//! from the data files.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Bytes in a MiB (NVML reports memory sizes in MiB: `memorySizeMB`).
pub(crate) const MIB: u64 = 1024 * 1024;

/// Largest memory-slice grid the data files may describe. A GPU's counter set holds one
/// `memory-slice-<n>` counter per memory slice plus seven resource counters, and Kubernetes allows
/// at most 32 counters per set (docs/reference/dra.md, "ResourceSlice limits").
pub(crate) const MAX_MEMORY_SLICES: u32 = 25;

/// GI profile enum names and values, `NVML_GPU_INSTANCE_PROFILE_*` (docs/reference/mig.md, "Profile IDs", `nvml.h` 13.3).
/// `nvmlDeviceGetGpuInstanceProfileInfo` takes the value; the *real* profile ID it returns is
/// [`GiProfile::id`].
pub(super) const GI_PROFILE_ENUMS: &[(&str, u32)] = &[
    ("NVML_GPU_INSTANCE_PROFILE_1_SLICE", 0),
    ("NVML_GPU_INSTANCE_PROFILE_2_SLICE", 1),
    ("NVML_GPU_INSTANCE_PROFILE_3_SLICE", 2),
    ("NVML_GPU_INSTANCE_PROFILE_4_SLICE", 3),
    ("NVML_GPU_INSTANCE_PROFILE_7_SLICE", 4),
    ("NVML_GPU_INSTANCE_PROFILE_8_SLICE", 5),
    ("NVML_GPU_INSTANCE_PROFILE_6_SLICE", 6),
    ("NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1", 7),
    ("NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1", 8),
    ("NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2", 9),
    ("NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX", 10),
    ("NVML_GPU_INSTANCE_PROFILE_2_SLICE_GFX", 11),
    ("NVML_GPU_INSTANCE_PROFILE_4_SLICE_GFX", 12),
    ("NVML_GPU_INSTANCE_PROFILE_1_SLICE_NO_ME", 13),
    ("NVML_GPU_INSTANCE_PROFILE_2_SLICE_NO_ME", 14),
    ("NVML_GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME", 15),
    ("NVML_GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME", 16),
];

/// CI profile enum names and values, `NVML_COMPUTE_INSTANCE_PROFILE_*` (docs/reference/mig.md, "Compute instances"). For CI
/// profiles the real ID equals the enum value.
pub(super) const CI_PROFILE_ENUMS: &[(&str, u32)] = &[
    ("NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE", 0),
    ("NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE", 1),
    ("NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE", 2),
    ("NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE", 3),
    ("NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE", 4),
    ("NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE", 5),
    ("NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE", 6),
    ("NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1", 7),
    ("NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE_NVL", 8),
];

/// The full-size compute-instance profile DAS creates inside a GPU instance (docs/reference/mig.md, "Compute instances": pick
/// the CI by the GI's slice count, never by reusing the GI enum).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CiProfile {
    /// CI profile ID; equals the `NVML_COMPUTE_INSTANCE_PROFILE_*` enum value.
    pub id: u32,
    /// The `NVML_COMPUTE_INSTANCE_PROFILE_*` enum name.
    pub nvml_enum: String,
}

/// One GPU-instance (GI) profile of a GPU model, as `nvidia-smi mig -lgip` / `-lgipp` print it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GiProfile {
    /// Real profile ID (`nvmlGpuInstanceProfileInfo_t.id`, what nvidia-smi prints and what
    /// `nvmlDeviceCreateGpuInstanceWithPlacement` takes), e.g. 19 for 1g on 8-slice GPUs.
    pub id: u32,
    /// The `NVML_GPU_INSTANCE_PROFILE_*` enum name (the index `…GetGpuInstanceProfileInfo` takes).
    pub nvml_enum: String,
    /// Profile name, e.g. `1g.10gb` or `1g.10gb+me`.
    pub name: String,
    /// Compute (SM) slices of the profile: the `<G>` of `<G>g.<mem>gb`.
    pub compute_slices: u32,
    /// Memory of a GPU instance of this profile (MiB).
    pub memory_mib: u64,
    /// Streaming multiprocessors.
    pub multiprocessors: u32,
    /// Copy engines (CE).
    pub copy_engines: u32,
    /// Video decoders (NVDEC).
    pub decoders: u32,
    /// Video encoders (NVENC).
    pub encoders: u32,
    /// JPEG decoders (NVJPG).
    pub jpeg_engines: u32,
    /// Optical-flow accelerators (OFA).
    pub ofa_engines: u32,
    /// Most instances of this profile on one GPU ("Total" of `-lgip`).
    pub max_instances: u32,
    /// A `+me` (media extension) profile: at most one such instance per GPU (docs/reference/mig.md, "Memory slices and placements").
    pub media_extension: bool,
    /// Size of every placement [memory slices].
    pub placement_size: u32,
    /// Allowed placement starts [memory slice index], ascending (`-lgipp`).
    pub placement_starts: Vec<u32>,
    /// The full-size CI profile created inside a GI of this profile.
    pub compute_instance: CiProfile,
}

impl GiProfile {
    /// The profile's resources: what one instance consumes from its GPU's counters.
    pub fn resources(&self) -> ResourceAmounts {
        ResourceAmounts {
            memory_mib: self.memory_mib,
            multiprocessors: u64::from(self.multiprocessors),
            copy_engines: u64::from(self.copy_engines),
            decoders: u64::from(self.decoders),
            encoders: u64::from(self.encoders),
            jpeg_engines: u64::from(self.jpeg_engines),
            ofa_engines: u64::from(self.ofa_engines),
        }
    }

    /// Memory of one instance (bytes).
    pub fn memory_bytes(&self) -> u64 {
        self.memory_mib * MIB
    }

    /// The `NVML_GPU_INSTANCE_PROFILE_*` enum value of [`Self::nvml_enum`].
    pub(crate) fn nvml_enum_value(&self) -> u32 {
        enum_value(GI_PROFILE_ENUMS, &self.nvml_enum).unwrap_or(u32::MAX)
    }

    /// Whether `start` is one of the profile's placement starts.
    pub(crate) fn allows_start(&self, start: u32) -> bool {
        self.placement_starts.contains(&start)
    }

    /// The profile name as a DNS label fragment, as used in device names: lower case, `.` and `+`
    /// become `-` (`1g.10gb+me` → `1g-10gb-me`).
    pub fn dns_label(&self) -> String {
        das_api::profile_dns_label(&self.name)
    }
}

/// The architectures a model may name, spelled as NVIDIA's DRA driver publishes them in
/// `architecture` (go-nvlib `GetArchitectureAsString`, from `nvmlDeviceGetArchitecture`), so CEL
/// written for `gpu.nvidia.com` ports by renaming the driver. `Unknown` is what a GPU of an
/// architecture newer than NVML's enum as DAS knows it gets (a model built from NVML's tables).
pub(crate) const ARCHITECTURES: &[&str] = &[
    "Kepler",
    "Maxwell",
    "Pascal",
    "Volta",
    "Turing",
    "Ampere",
    "Ada Lovelace",
    "Hopper",
    "Blackwell",
    "Unknown",
];

/// A GPU model from one data file: identity, and either the geometry and GI profile table of a
/// MIG-capable GPU, or (`mig = false`) the whole-GPU facts of a GPU without MIG.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuModel {
    /// Model name used in `--emulated-gpus`, e.g. `A100-SXM4-40GB`.
    pub name: String,
    /// Other accepted names, e.g. `H100-80GB`.
    #[serde(default)]
    pub aliases: Vec<String>,
    /// The name NVML reports (`nvmlDeviceGetName`), e.g. `NVIDIA A100-SXM4-40GB`.
    pub product_name: String,
    /// PCI device IDs (`0xDDDDVVVV`, NVML's `pciDeviceId`) the table applies to.
    pub pci_device_ids: Vec<u32>,
    /// PCI subsystem IDs (`0xSSSSVVVV`: subsystem device ID, subsystem vendor ID; NVML's
    /// `pciSubSystemId`) the file is limited to; empty: every subsystem. Needed where one device
    /// ID covers two products (A2 and A16 are both `0x25B610DE`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pci_subsystem_ids: Vec<u32>,
    /// One of [`ARCHITECTURES`]: `Turing`, `Ampere`, `Ada Lovelace`, `Hopper`, `Blackwell`.
    pub architecture: String,
    /// CUDA compute capability, `major.minor`.
    pub cuda_compute_capability: String,
    /// Total device memory as nvidia-smi reports it (MiB).
    pub memory_mib: u64,
    /// Whether the GPU has MIG (`mig = false` in the files of T4, L4, …: no profile table, no
    /// geometry; the GPU is served whole, docs/design.md §7, "Whole GPUs"). Default `true`.
    #[serde(default = "mig_default")]
    pub mig: bool,
    /// Streaming multiprocessors of the whole GPU, where known: every data file of a GPU without
    /// MIG gives it (published as the whole GPU's `multiprocessors` capacity); MIG files leave it
    /// out (their whole GPUs show the most a MIG layout holds, [`Self::counter_totals`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multiprocessors: Option<u32>,
    /// Memory slices: the placement grid (8 on A100/H100/H200/B200, 4 on A30, 12 on RTX PRO 6000).
    /// A GPU without MIG has none in its file and 1 once loaded: the whole GPU is its one unit
    /// (its counter `memory-slice-0`, its whole-GPU placement `{0, 1}`).
    #[serde(default)]
    pub memory_slices: u32,
    /// Compute (SM) slices (7 on A100/H100/H200/B200, 4 on A30 and RTX PRO 6000; 0 without MIG).
    #[serde(default)]
    pub compute_slices: u32,
    /// Most GPU instances at once (0 without MIG).
    #[serde(default)]
    pub max_gpu_instances: u32,
    /// Ampere: toggling MIG mode needs a GPU reset, so DAS never toggles it (docs/reference/mig.md,
    /// "MIG mode"). Required in a MIG file, absent without MIG
    /// ([`Self::mig_mode_change_requires_reset`]).
    #[serde(
        default,
        rename = "mig_mode_change_requires_reset",
        skip_serializing_if = "Option::is_none"
    )]
    pub mig_mode_reset: Option<bool>,
    /// The GI profiles, in file order (small to large); none without MIG.
    #[serde(default)]
    pub profiles: Vec<GiProfile>,
    /// The data file this model came from (set on load).
    #[serde(skip)]
    pub source_file: String,
    /// The most any hardware-valid layout of this GPU consumes of each resource: the values of the
    /// GPU's shared counters (computed on load by enumerating every valid layout). Without MIG:
    /// the whole GPU's memory and multiprocessors.
    #[serde(skip)]
    pub counter_totals: ResourceAmounts,
    /// The resource counters DAS publishes in this GPU's counter set and device consumption,
    /// besides `memory-slice-<n>` (computed on load, [`crate::gpu::layout::needed_counters`]):
    /// `memory` and the few others the hardware rules need. Empty: every resource counter.
    /// Without MIG: `memory` alone.
    #[serde(skip)]
    pub published_counters: Vec<&'static str>,
}

fn mig_default() -> bool {
    true
}

impl GpuModel {
    /// Whether resource counter `name` (`memory`, `multiprocessors`, …) is published for this GPU.
    pub(crate) fn publishes_counter(&self, name: &str) -> bool {
        self.published_counters.is_empty() || self.published_counters.contains(&name)
    }

    /// Whether a MIG mode change needs a GPU reset: the file says so (Ampere); `false` for a GPU
    /// without MIG (it has no mode to change).
    pub(crate) fn mig_mode_change_requires_reset(&self) -> bool {
        self.mig_mode_reset.unwrap_or(false)
    }

    /// Whether `pci_device_id` (`0xDDDDVVVV`) with subsystem `pci_subsystem_id` (`0xSSSSVVVV`,
    /// 0 when unknown) is this model's: one of its device IDs, and one of its subsystem IDs
    /// where it lists any.
    pub(crate) fn matches_pci(&self, pci_device_id: u32, pci_subsystem_id: u32) -> bool {
        self.pci_device_ids.contains(&pci_device_id)
            && (self.pci_subsystem_ids.is_empty()
                || self.pci_subsystem_ids.contains(&pci_subsystem_id))
    }

    /// The profile named `name` (exact match), with its index in [`Self::profiles`].
    pub fn profile(&self, name: &str) -> Option<(usize, &GiProfile)> {
        self.profiles
            .iter()
            .enumerate()
            .find(|(_, p)| p.name == name)
    }

    /// Whether `name` is this model's name or one of its aliases (ASCII case-insensitive).
    pub(crate) fn answers_to(&self, name: &str) -> bool {
        self.name.eq_ignore_ascii_case(name)
            || self.aliases.iter().any(|a| a.eq_ignore_ascii_case(name))
    }

    /// The profile names, comma-separated, for error messages; `none (no MIG)` without MIG.
    pub fn profile_names(&self) -> String {
        if !self.mig {
            return "none (no MIG: served whole)".into();
        }
        self.profiles
            .iter()
            .map(|p| p.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Total device memory (bytes).
    pub fn memory_bytes(&self) -> u64 {
        self.memory_mib * MIB
    }
}

impl fmt::Display for GpuModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

pub(super) fn enum_value(table: &[(&str, u32)], name: &str) -> Option<u32> {
    table.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
}

/// Parses `major.minor` into numbers.
pub(crate) fn parse_compute_capability(cc: &str) -> Option<(u32, u32)> {
    let (major, minor) = cc.split_once('.')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// Amounts of the resources a GPU instance holds and a counter set counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ResourceAmounts {
    /// Memory (MiB).
    pub memory_mib: u64,
    /// Streaming multiprocessors.
    pub multiprocessors: u64,
    /// Copy engines.
    pub copy_engines: u64,
    /// Video decoders.
    pub decoders: u64,
    /// Video encoders.
    pub encoders: u64,
    /// JPEG decoders.
    pub jpeg_engines: u64,
    /// Optical-flow accelerators.
    pub ofa_engines: u64,
}

impl ResourceAmounts {
    /// Memory (bytes).
    pub fn memory_bytes(&self) -> u64 {
        self.memory_mib * MIB
    }

    /// The amounts as `(counter name, value)` pairs, memory in bytes, in docs/design.md §3 order.
    pub fn counters(&self) -> [(&'static str, u64); 7] {
        use das_api::counters as c;
        [
            (c::MEMORY, self.memory_bytes()),
            (c::MULTIPROCESSORS, self.multiprocessors),
            (c::COPY_ENGINES, self.copy_engines),
            (c::DECODERS, self.decoders),
            (c::ENCODERS, self.encoders),
            (c::JPEG_ENGINES, self.jpeg_engines),
            (c::OFA_ENGINES, self.ofa_engines),
        ]
    }

    fn zip(self, o: Self, f: impl Fn(u64, u64) -> u64) -> Self {
        Self {
            memory_mib: f(self.memory_mib, o.memory_mib),
            multiprocessors: f(self.multiprocessors, o.multiprocessors),
            copy_engines: f(self.copy_engines, o.copy_engines),
            decoders: f(self.decoders, o.decoders),
            encoders: f(self.encoders, o.encoders),
            jpeg_engines: f(self.jpeg_engines, o.jpeg_engines),
            ofa_engines: f(self.ofa_engines, o.ofa_engines),
        }
    }

    /// Component-wise sum.
    pub fn plus(self, o: Self) -> Self {
        self.zip(o, |a, b| a + b)
    }

    /// Component-wise difference, saturating at 0.
    pub fn minus(self, o: Self) -> Self {
        self.zip(o, u64::saturating_sub)
    }

    /// Component-wise maximum.
    pub fn max(self, o: Self) -> Self {
        self.zip(o, u64::max)
    }

    /// The first counter (by name) among those `kept` accepts where `self` exceeds `cap`, if any.
    pub(crate) fn first_excess(
        &self,
        cap: &Self,
        kept: impl Fn(&str) -> bool,
    ) -> Option<&'static str> {
        self.counters()
            .into_iter()
            .zip(cap.counters())
            .find(|((name, have), (_, limit))| kept(name) && have > limit)
            .map(|((name, _), _)| name)
    }
}
