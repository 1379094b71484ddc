//! Unit tests of [`super`] (`pci.rs`): bus IDs, and PCIe roots read from a sysfs tree of
//! symlinks laid out as the kernel lays it out.

use std::os::unix::fs::symlink;
use std::path::Path;

use super::*;

/// `<sys>/bus/pci/devices/<bus_id>` → `target` (relative, as the kernel writes it).
fn link(sys: &Path, bus_id: &str, target: &str) {
    let dir = sys.join("bus/pci/devices");
    fs::create_dir_all(&dir).unwrap();
    symlink(target, dir.join(bus_id)).unwrap();
}

#[test]
fn nvml_bus_ids_take_the_standard_form() {
    assert_eq!(
        standard_bus_id("00000000:3B:00.0").as_deref(),
        Some("0000:3b:00.0")
    );
    assert_eq!(
        standard_bus_id("0000:3b:00.0").as_deref(),
        Some("0000:3b:00.0")
    );
    assert_eq!(
        standard_bus_id("00000001:C1:1F.7").as_deref(),
        Some("0001:c1:1f.7")
    );
    for bad in [
        "",
        "3b:00.0",
        "00010000:3b:00.0",
        "0000:3b:00",
        "0000:3b:0.0",
        "0000:3g:00.0",
        "0000:3b:00.10",
        "0000:3b:00.0/../..",
    ] {
        assert_eq!(standard_bus_id(bad), None, "{bad}");
    }
}

#[test]
fn the_pcie_root_is_the_first_folder_under_devices() {
    let dir = tempfile::tempdir().unwrap();
    let sys = dir.path();
    // A GPU behind two bridges (a PCIe switch), one on a root bus, one in PCI domain 1.
    link(
        sys,
        "0000:3b:00.0",
        "../../../devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0",
    );
    link(
        sys,
        "0000:c3:00.0",
        "../../../devices/pci0000:c0/0000:c0:01.1/0000:c1:00.0/0000:c2:00.0/0000:c3:00.0",
    );
    link(
        sys,
        "0001:00:04.0",
        "../../../devices/pci0001:00/0001:00:04.0",
    );
    assert_eq!(pcie_root(sys, "0000:3b:00.0").as_deref(), Ok("pci0000:3a"));
    assert_eq!(pcie_root(sys, "0000:c3:00.0").as_deref(), Ok("pci0000:c0"));
    assert_eq!(pcie_root(sys, "0001:00:04.0").as_deref(), Ok("pci0001:00"));
    // An absolute target under the same root is read the same way.
    let abs = sys.join("devices/pci0000:80/0000:80:02.0/0000:81:00.0");
    link(sys, "0000:81:00.0", abs.to_str().unwrap());
    assert_eq!(pcie_root(sys, "0000:81:00.0").as_deref(), Ok("pci0000:80"));
}

#[test]
fn a_missing_or_odd_link_gives_no_root() {
    let dir = tempfile::tempdir().unwrap();
    let sys = dir.path();
    let missing = pcie_root(sys, "0000:3b:00.0").unwrap_err();
    assert!(
        missing.contains("bus/pci/devices/0000:3b:00.0"),
        "{missing}"
    );
    // Not under devices/, not under a pci* root, not ending in the bus ID.
    link(
        sys,
        "0000:01:00.0",
        "../../../elsewhere/pci0000:00/0000:01:00.0",
    );
    link(
        sys,
        "0000:02:00.0",
        "../../../devices/platform/0000:02:00.0",
    );
    link(
        sys,
        "0000:03:00.0",
        "../../../devices/pci0000:00/0000:00:03.0",
    );
    link(sys, "0000:04:00.0", "../../../devices/pci0000:00");
    for bus in [
        "0000:01:00.0",
        "0000:02:00.0",
        "0000:03:00.0",
        "0000:04:00.0",
    ] {
        let e = pcie_root(sys, bus).unwrap_err();
        assert!(e.contains("points to"), "{bus}: {e}");
    }
    // Only standard bus IDs are looked up (no path tricks, no NVML form).
    assert!(pcie_root(sys, "00000000:3B:00.0").is_err());
    assert!(pcie_root(sys, "../../etc").is_err());
}

#[test]
fn emulated_addresses_are_well_formed_and_paired() {
    assert_eq!(emulated_bus_id(0), "0000:10:00.0");
    assert_eq!(emulated_bus_id(31), "0000:2f:00.0");
    for i in 0..32 {
        let bus = emulated_bus_id(i);
        assert_eq!(standard_bus_id(&bus).as_deref(), Some(bus.as_str()));
    }
    let roots: Vec<String> = (0..5).map(emulated_pcie_root).collect();
    assert_eq!(
        roots,
        [
            "pci0000:10",
            "pci0000:10",
            "pci0000:12",
            "pci0000:12",
            "pci0000:14"
        ]
    );
}

/// `numa_node` is read through the device's link, as the kernel lays it out: a node, none
/// (`-1`), or an error that names the file.
#[test]
fn the_numa_node_is_read_through_the_device_link() {
    let dir = tempfile::tempdir().unwrap();
    let sys = dir.path();
    let device = |bus: &str, numa: &str| {
        let target = format!("devices/pci0000:00/{bus}");
        fs::create_dir_all(sys.join(&target)).unwrap();
        fs::write(sys.join(&target).join("numa_node"), numa).unwrap();
        link(sys, bus, &format!("../../../{target}"));
    };
    device("0000:3b:00.0", "1\n");
    device("0000:3c:00.0", "-1\n");
    device("0000:3d:00.0", "0");
    device("0000:3e:00.0", "node 0\n");
    device("0000:3f:00.0", "1024\n");
    assert_eq!(numa_node(sys, "0000:3b:00.0"), Ok(Some(1)));
    assert_eq!(numa_node(sys, "0000:3d:00.0"), Ok(Some(0)));
    assert_eq!(numa_node(sys, "0000:3c:00.0"), Ok(None), "-1: no NUMA node");
    for bad in ["0000:3e:00.0", "0000:3f:00.0"] {
        let e = numa_node(sys, bad).unwrap_err();
        assert!(e.contains("is not a NUMA node") && e.contains(bad), "{e}");
    }
    let missing = numa_node(sys, "0000:40:00.0").unwrap_err();
    assert!(missing.contains("0000:40:00.0/numa_node"), "{missing}");
    assert!(numa_node(sys, "00000000:3B:00.0").is_err());
    assert!(numa_node(sys, "../../etc").is_err());
}

#[test]
fn emulated_gpus_sit_four_to_a_numa_node() {
    let nodes: Vec<u32> = (0..9).map(emulated_numa_node).collect();
    assert_eq!(nodes, [0, 0, 0, 0, 1, 1, 1, 1, 2]);
}
