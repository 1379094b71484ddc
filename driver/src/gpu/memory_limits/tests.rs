use super::*;

const CAPACITY: &str =
    "nvidia/0000:01:00.0/vidmem 85899345920\nnvidia/0000:3B:00.0/vidmem 85899345920\n";

#[test]
fn a_gpu_is_enforced_only_with_driver_615_and_its_bus_id_listed() {
    let listed = Some("0000:01:00.0");
    assert_eq!(
        enforcement(Some(CAPACITY), "615.12.03", listed),
        MemoryEnforcement::Enforced
    );
    assert_eq!(
        enforcement(Some(CAPACITY), "620.1", listed),
        MemoryEnforcement::Enforced
    );
    assert_eq!(
        enforcement(Some(CAPACITY), "610.99.01", listed),
        MemoryEnforcement::Mps,
        "r610 has no dmem limits"
    );
    assert_eq!(
        enforcement(Some(CAPACITY), "garbage", listed),
        MemoryEnforcement::Mps
    );
    assert_eq!(
        enforcement(Some(CAPACITY), "615.12.03", Some("0000:02:00.0")),
        MemoryEnforcement::Mps,
        "another GPU's line"
    );
    assert_eq!(
        enforcement(None, "615.12.03", listed),
        MemoryEnforcement::Mps,
        "no dmem.capacity"
    );
    assert_eq!(
        enforcement(Some(CAPACITY), "615.12.03", None),
        MemoryEnforcement::Mps,
        "no bus ID"
    );
    assert_eq!(MemoryEnforcement::Enforced.as_str(), "enforced");
    assert_eq!(MemoryEnforcement::Mps.as_str(), "mps");
}

#[test]
fn bus_ids_compare_in_the_standard_form_whatever_their_case_and_domain_width() {
    // NVML's 8-digit domain, upper-case hex on either side.
    assert!(capacity_lists(CAPACITY, "00000000:01:00.0"));
    assert!(capacity_lists(CAPACITY, "0000:3b:00.0"));
    assert!(capacity_lists(CAPACITY, "00000000:3B:00.0"));
    assert!(
        !capacity_lists(CAPACITY, "0000:01:00.1"),
        "another function"
    );
    assert!(!capacity_lists(CAPACITY, "not a bus id"));
    // Only `nvidia/<bus>/vidmem` regions count.
    assert!(!capacity_lists(
        "amdgpu/0000:01:00.0/vram 1\n",
        "0000:01:00.0"
    ));
    assert!(!capacity_lists(
        "nvidia/0000:01:00.0/sysmem 1\n",
        "0000:01:00.0"
    ));
    assert!(!capacity_lists(
        "nvidia/0000:01:00.0/vidmem/x 1\n",
        "0000:01:00.0"
    ));
    assert!(!capacity_lists("", "0000:01:00.0"));
}

#[test]
fn the_capacity_file_is_none_when_missing_and_read_when_there() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(read_dmem_capacity(dir.path()).unwrap(), None);
    std::fs::write(dir.path().join(DMEM_CAPACITY_FILE), CAPACITY).unwrap();
    assert_eq!(
        read_dmem_capacity(dir.path()).unwrap().as_deref(),
        Some(CAPACITY)
    );
    // A directory where the file should be: an error naming it.
    let other = tempfile::tempdir().unwrap();
    std::fs::create_dir(other.path().join(DMEM_CAPACITY_FILE)).unwrap();
    let err = read_dmem_capacity(other.path()).unwrap_err();
    assert!(err.to_string().contains("dmem.capacity"), "{err}");
}

#[test]
fn the_flags_decide_per_gpu_and_emulated_gpus_ask_the_fake_tree_only() {
    let dir = tempfile::tempdir().unwrap();
    let gpu = |index: u32, driver: &str| GpuInfo {
        pci_bus_id: Some(crate::gpu::pci::emulated_bus_id(index)),
        driver_version: driver.into(),
        ..GpuInfo::for_tests(index, "H100-80GB")
    };
    let settings = |choice, emulated| EnforcementSettings {
        choice,
        cgroup_root: dir.path().to_path_buf(),
        emulated,
    };
    let auto_real = settings(EnforcementChoice::Auto, false);
    // No file yet: MPS only.
    assert_eq!(
        gpu_memory_enforcement(&auto_real, &gpu(0, "615.1")),
        MemoryEnforcement::Mps
    );
    std::fs::write(
        dir.path().join(DMEM_CAPACITY_FILE),
        "nvidia/0000:10:00.0/vidmem 85899345920\n",
    )
    .unwrap();
    assert_eq!(
        gpu_memory_enforcement(&auto_real, &gpu(0, "615.1")),
        MemoryEnforcement::Enforced
    );
    assert_eq!(
        gpu_memory_enforcement(&auto_real, &gpu(0, "580.95.05")),
        MemoryEnforcement::Mps
    );
    assert_eq!(
        gpu_memory_enforcement(&auto_real, &gpu(1, "615.1")),
        MemoryEnforcement::Mps,
        "GPU 1 (0000:11:00.0) is not listed"
    );
    // Emulated GPUs report driver 580: the fake tree alone decides.
    let auto_emulated = settings(EnforcementChoice::Auto, true);
    assert_eq!(
        gpu_memory_enforcement(&auto_emulated, &gpu(0, "580.95.05")),
        MemoryEnforcement::Enforced
    );
    assert_eq!(
        gpu_memory_enforcement(&auto_emulated, &gpu(1, "580.95.05")),
        MemoryEnforcement::Mps
    );
    // --memory-enforcement=mps never claims enforced.
    for emulated in [false, true] {
        assert_eq!(
            gpu_memory_enforcement(
                &settings(EnforcementChoice::Mps, emulated),
                &gpu(0, "615.1")
            ),
            MemoryEnforcement::Mps
        );
    }
}

#[test]
fn the_choice_parses_auto_and_mps_and_names_them_otherwise() {
    assert_eq!(
        EnforcementChoice::parse("auto"),
        Ok(EnforcementChoice::Auto)
    );
    assert_eq!(
        EnforcementChoice::parse(" mps "),
        Ok(EnforcementChoice::Mps)
    );
    assert_eq!(EnforcementChoice::default(), EnforcementChoice::Auto);
    let err = EnforcementChoice::parse("enforced").unwrap_err();
    assert_eq!(
        err.to_string(),
        "\"enforced\" is not a memory enforcement: valid are auto (detect per GPU) and mps (never set kernel limits)"
    );
}
