//! The GPU facts discovery reads for the published attributes (docs/design.md §3) on the fake
//! NVML: brand, CUDA driver version, the standard PCI bus ID, and the PCIe root and NUMA node
//! from a sysfs tree ([`NvmlBackend::with_sys_root`]); each left out, never fatal, when it
//! cannot be read.

use std::os::unix::fs::symlink;

use super::*;
use crate::gpu::GpuInfo;

fn inventory(fake: FakeNvml) -> Vec<GpuInfo> {
    NvmlBackend::with_whole_gpus(fake, options(Path::new("/nonexistent-proc")), true)
        .unwrap()
        .inventory()
        .unwrap()
}

#[test]
fn brand_and_cuda_driver_version_are_read_at_discovery() {
    let tesla = FakeGpuSpec {
        brand: 2,
        ..a100(true)
    };
    let fake = FakeNvml::new(vec![a100(true), tesla, h100(false)]);
    let b =
        NvmlBackend::with_whole_gpus(fake, options(Path::new("/nonexistent-proc")), true).unwrap();
    let inv = b.inventory().unwrap();
    let brands: Vec<Option<&str>> = inv.iter().map(|g| g.brand.as_deref()).collect();
    assert_eq!(brands, [Some("Nvidia"), Some("Tesla"), Some("Nvidia")]);
    assert!(
        inv.iter()
            .all(|g| g.cuda_driver_version.as_deref() == Some("13.0")),
        "{inv:?}"
    );
    // NVML's `00000000:1X:00.0`, in the standard form; no PCIe root without a sysfs root.
    let buses: Vec<Option<&str>> = inv.iter().map(|g| g.pci_bus_id.as_deref()).collect();
    assert_eq!(
        buses,
        [
            Some("0000:10:00.0"),
            Some("0000:11:00.0"),
            Some("0000:12:00.0")
        ]
    );
    assert!(inv.iter().all(|g| g.pcie_root.is_none()));
    let counts = b.api().call_counts();
    assert_eq!(
        counts["nvmlSystemGetCudaDriverVersion_v2"], 1,
        "once per node"
    );
    assert_eq!(counts["nvmlDeviceGetBrand"], 3, "once per GPU served");
}

#[test]
fn unreadable_facts_are_left_out_not_fatal() {
    let nameless = FakeGpuSpec {
        brand: 99,
        ..a100(true)
    };
    let fake = FakeNvml::new(vec![a100(true), nameless]);
    fake.fail_next("nvmlSystemGetCudaDriverVersion_v2", code::NOT_SUPPORTED);
    fake.fail_next("nvmlDeviceGetBrand", code::UNKNOWN);
    let inv = inventory(fake);
    assert_eq!(inv.len(), 2, "both GPUs are still served");
    assert!(inv.iter().all(|g| g.cuda_driver_version.is_none()));
    assert_eq!(inv[0].brand, None, "NVML failed");
    assert_eq!(inv[1].brand, None, "a value without a name");
}

#[test]
fn the_pcie_root_is_read_from_sysfs() {
    let dir = tempfile::tempdir().unwrap();
    let sys = dir.path();
    let devices = sys.join("bus/pci/devices");
    fs::create_dir_all(&devices).unwrap();
    // GPU 0 behind a switch under root complex pci0000:0f; GPU 1 is not in this sysfs.
    symlink(
        "../../../devices/pci0000:0f/0000:0f:01.0/0000:10:00.0",
        devices.join("0000:10:00.0"),
    )
    .unwrap();
    let fake = FakeNvml::new(vec![a100(true), h100(false)]);
    let b = NvmlBackend::with_whole_gpus(fake, options(Path::new("/nonexistent-proc")), true)
        .unwrap()
        .with_sys_root(sys);
    let inv = b.inventory().unwrap();
    assert_eq!(inv[0].pcie_root.as_deref(), Some("pci0000:0f"));
    assert_eq!(inv[1].pcie_root, None);
    assert_eq!(inv[1].pci_bus_id.as_deref(), Some("0000:11:00.0"));
}

/// The NUMA node comes from the device's `numa_node` in sysfs: a node, none for `-1`, none for a
/// GPU sysfs does not list; a GPU without MIG gets it as any other.
#[test]
fn the_numa_node_is_read_from_sysfs() {
    let dir = tempfile::tempdir().unwrap();
    let sys = dir.path();
    let devices = sys.join("bus/pci/devices");
    fs::create_dir_all(&devices).unwrap();
    for (bus, numa) in [("0000:10:00.0", "1\n"), ("0000:11:00.0", "-1\n")] {
        let target = format!("devices/pci0000:0f/{bus}");
        fs::create_dir_all(sys.join(&target)).unwrap();
        fs::write(sys.join(&target).join("numa_node"), numa).unwrap();
        symlink(format!("../../../{target}"), devices.join(bus)).unwrap();
    }
    let l4 = FakeGpuSpec::without_mig(crate::gpu::find_model("L4").unwrap().unwrap());
    let fake = FakeNvml::new(vec![l4, a100(true), h100(true)]);
    let b = NvmlBackend::with_whole_gpus(fake, options(Path::new("/nonexistent-proc")), true)
        .unwrap()
        .with_sys_root(sys);
    let inv = b.inventory().unwrap();
    let numa: Vec<Option<u32>> = inv.iter().map(|g| g.numa_node).collect();
    assert_eq!(numa, [Some(1), None, None]);
    assert_eq!(inv[0].pcie_root.as_deref(), Some("pci0000:0f"));
    assert_eq!(inv[1].pcie_root.as_deref(), Some("pci0000:0f"));
}

#[test]
fn brand_names_and_cuda_versions_follow_nvidias_driver() {
    assert_eq!(brand_name(14), Some("Nvidia"));
    assert_eq!(brand_name(2), Some("Tesla"));
    assert_eq!(brand_name(11), Some("NvidiaCloudGaming"));
    assert_eq!(brand_name(16), Some("TitanRTX"));
    assert_eq!(brand_name(17), None);
    assert_eq!(cuda_version(12090), "12.9");
    assert_eq!(cuda_version(13000), "13.0");
    assert_eq!(cuda_version(11080), "11.8");
}

/// `nvmlDeviceGetArchitecture` values by NVIDIA's DRA driver's names (go-nvlib
/// `GetArchitectureAsString`), `Ada Lovelace` included; unknown ones are `Unknown`.
#[test]
fn architecture_names_follow_nvidias_driver() {
    let names: Vec<&str> = (2..=11).map(architecture_name).collect();
    assert_eq!(
        names,
        [
            "Kepler",
            "Maxwell",
            "Pascal",
            "Volta",
            "Turing",
            "Ampere",
            "Ada Lovelace",
            "Hopper",
            "Blackwell",
            "Unknown"
        ]
    );
    assert_eq!(architecture_name(u32::MAX), "Unknown");
    for name in &names {
        assert!(crate::gpu::model::ARCHITECTURES.contains(name), "{name}");
    }
}
