//! The emulated GPUs' identities: GPU UUIDs from the node name and index (stable across
//! restarts), MIG UUIDs from the GPU UUID and a serial, both in NVML's format, and the
//! [`GpuInfo`] the inventory reports (with synthetic PCI bus IDs, PCIe roots and NUMA nodes from
//! the index, `pci::emulated_bus_id`, and fixed brand and versions).

use das_runtime::hash::fnv1a64_from;

use super::gpus_flag::{EmulatedGpuSpec, parse_emulated_spec};
use super::{
    EMULATED_BRAND, EMULATED_CUDA_DRIVER_VERSION, EMULATED_DRIVER_VERSION, EmuGpu, EmulatedError,
};
use crate::gpu::{GpuInfo, MigSwitch, pci};

/// The GPUs of `spec` on node `node_name` as the emulated hardware has them, without opening (or
/// creating) any state: what `das-kubelet-plugin --print-inventory` shows. GPUs with MIG mode
/// off (`mig-off`) are included, with `GpuInfo::mig_enabled` false; the backend reports those
/// only with `--whole-gpus`, so keep `GpuInfo::served(whole_gpus)` for what it reports. The MIG
/// mode is the spec's (a state file may hold another, switched by a plugin), and no GPU allows a
/// switch ([`MigSwitch::off`], or [`MigSwitch::no_mig`] for a GPU without MIG).
///
/// # Errors
/// A bad spec.
pub fn emulated_inventory(spec: &str, node_name: &str) -> Result<Vec<GpuInfo>, EmulatedError> {
    Ok(build_gpus(&parse_emulated_spec(spec)?, node_name)
        .iter()
        .map(|g| gpu_info(g, g.mig_enabled, MigSwitch::base(&g.model)))
        .collect())
}

/// What the inventory reports of GPU `g` with MIG mode `mig_enabled` now.
pub(super) fn gpu_info(g: &EmuGpu, mig_enabled: bool, mig_switch: MigSwitch) -> GpuInfo {
    GpuInfo {
        index: g.index,
        uuid: g.uuid.clone(),
        model: g.model.clone(),
        product_name: g.model.product_name.clone(),
        minor: g.index,
        pci_bus_id: Some(pci::emulated_bus_id(g.index)),
        pcie_root: Some(pci::emulated_pcie_root(g.index)),
        numa_node: Some(pci::emulated_numa_node(g.index)),
        memory_mib: g.model.memory_mib,
        brand: Some(EMULATED_BRAND.to_string()),
        driver_version: EMULATED_DRIVER_VERSION.to_string(),
        cuda_driver_version: Some(EMULATED_CUDA_DRIVER_VERSION.to_string()),
        mig_enabled,
        mig_switch,
    }
}

pub(super) fn build_gpus(specs: &[EmulatedGpuSpec], node_name: &str) -> Vec<EmuGpu> {
    let models = specs
        .iter()
        .flat_map(|s| std::iter::repeat_n(s, s.count as usize));
    models
        .enumerate()
        .map(|(i, spec)| {
            let index = i as u32;
            EmuGpu {
                index,
                uuid: format_uuid("GPU-", &[node_name.as_bytes(), &index.to_le_bytes()]),
                model: spec.model.clone(),
                mig_enabled: spec.mig_enabled,
            }
        })
        .collect()
}

/// SplitMix64 finaliser: spreads FNV's weak low bits.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A stable 128-bit hash of length-prefixed `parts`, formatted as
/// `<prefix>xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` (NVML's UUID format). Implemented here, not with
/// `std`'s hasher, so UUIDs never change across Rust versions.
pub(super) fn format_uuid(prefix: &str, parts: &[&[u8]]) -> String {
    let mut a = 0xcbf2_9ce4_8422_2325u64;
    let mut b = 0x6c62_272e_07bb_0142u64;
    for part in parts {
        let len = (part.len() as u64).to_le_bytes();
        a = fnv1a64_from(fnv1a64_from(a, &len), part);
        b = fnv1a64_from(fnv1a64_from(b, part), &len);
    }
    let hex = format!("{:016x}{:016x}", mix(a), mix(b ^ a.rotate_left(17)));
    format!(
        "{prefix}{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}
