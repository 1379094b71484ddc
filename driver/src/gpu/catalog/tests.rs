//! Unit tests of [`super`] (`catalog.rs`): the built-in models and the data-file rules.

use super::*;
use std::collections::{BTreeMap, BTreeSet};

fn model(name: &str) -> Arc<GpuModel> {
    find_model(name)
        .unwrap()
        .unwrap_or_else(|| panic!("no model {name}"))
}

fn placements(m: &GpuModel, profile: &str) -> (Vec<u32>, u32) {
    let (_, p) = m.profile(profile).unwrap();
    (p.placement_starts.clone(), p.placement_size)
}

/// Every name derived from a profile (DeviceClass, legacy resource, device-name label, the
/// webhook's template label) is distinct for distinct profiles of all models together, and
/// every DeviceClass name is a DNS subdomain.
#[test]
fn names_derived_from_profiles_never_collide() {
    let profiles: BTreeSet<String> = builtin_models()
        .unwrap()
        .iter()
        .flat_map(|m| m.profiles.iter().map(|p| p.name.clone()))
        .collect();
    assert!(profiles.contains("1g.24gb-me") && profiles.contains("1g.24gb+me"));
    type Derive = fn(&str) -> String;
    let derived: [(&str, Derive); 4] = [
        ("DeviceClass", das_api::profile_device_class),
        ("legacy resource", das_api::legacy_profile_name),
        ("device-name label", das_api::profile_dns_label),
        ("template label", |p| {
            das_api::profile_dns_label(&das_api::legacy_profile_name(p))
        }),
    ];
    for (what, f) in derived {
        let mut seen: BTreeMap<String, &str> = BTreeMap::new();
        for p in &profiles {
            if let Some(other) = seen.insert(f(p), p) {
                panic!("{what} of {p} and {other} is the same: {}", f(p));
            }
        }
    }
    let dns_label = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    for p in &profiles {
        let class = das_api::profile_device_class(p);
        assert!(class.split('.').all(dns_label), "{class}");
    }
}

/// The tables of docs/supported-gpus.md, from the data files: MIG-capable models, then the GPUs
/// without MIG (served whole).
fn supported_gpus_table() -> String {
    let mut out = String::from(
        "| model (`--emulated-gpus`) | NVML name | PCI device IDs | architecture | memory slices | most GPU instances | MIG mode change | profiles (`nvidia.com/mig-<name>`) |\n|---|---|---|---|---|---|---|---|\n",
    );
    let mut models: Vec<_> = builtin_models().unwrap().iter().collect();
    models.sort_by(|a, b| a.name.cmp(&b.name));
    let ids = |m: &GpuModel| -> String {
        let ids: Vec<String> = m
            .pci_device_ids
            .iter()
            .map(|i| format!("`0x{i:08X}`"))
            .collect();
        let subsystems: Vec<String> = m
            .pci_subsystem_ids
            .iter()
            .map(|i| format!("`0x{i:08X}`"))
            .collect();
        if subsystems.is_empty() {
            ids.join(", ")
        } else {
            format!("{} (subsystem {})", ids.join(", "), subsystems.join(", "))
        }
    };
    for m in models.iter().filter(|m| m.mig) {
        let profiles: Vec<String> = m
            .profiles
            .iter()
            .map(|p| format!("`{}`", das_api::legacy_profile_name(&p.name)))
            .collect();
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | {} | {} | {} | {} |\n",
            m.name,
            m.product_name,
            ids(m),
            m.architecture,
            m.memory_slices,
            m.max_gpu_instances,
            if m.mig_mode_change_requires_reset() {
                "needs a GPU reset"
            } else {
                "DAS can switch it (`enableMigMode`, `wholeGpus.switchMigMode`)"
            },
            profiles.join(", ")
        ));
    }
    out.push_str(
        "\nWithout MIG, served whole (`gpu-<index>`, DeviceClass `gpu.das.com`) with `wholeGpus.enabled`:\n\n\
         | model (`--emulated-gpus`) | NVML name | PCI device IDs | architecture | compute capability | memory (MiB) | multiprocessors |\n|---|---|---|---|---|---|---|\n",
    );
    for m in models.iter().filter(|m| !m.mig) {
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | {} | {} | {} |\n",
            m.name,
            m.product_name,
            ids(m),
            m.architecture,
            m.cuda_compute_capability,
            m.memory_mib,
            m.multiprocessors.map_or("-".into(), |n| n.to_string()),
        ));
    }
    out
}

/// docs/supported-gpus.md lists exactly the built-in models; regenerate with
/// `DAS_UPDATE_DOCS=1 cargo test -p das-driver --lib supported_gpus`.
#[test]
fn supported_gpus_doc_matches_the_data_files() {
    const BEGIN: &str = "<!-- generated from driver/data/gpus: begin -->\n";
    const END: &str = "<!-- generated from driver/data/gpus: end -->";
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/supported-gpus.md");
    let doc = std::fs::read_to_string(&path).unwrap();
    let (head, rest) = doc.split_once(BEGIN).expect("begin marker");
    let (_, tail) = rest.split_once(END).expect("end marker");
    let want = format!("{head}{BEGIN}{}{END}{tail}", supported_gpus_table());
    if std::env::var_os("DAS_UPDATE_DOCS").is_some() {
        std::fs::write(&path, &want).unwrap();
    }
    assert!(
        doc == want,
        "docs/supported-gpus.md is stale: run `DAS_UPDATE_DOCS=1 cargo test -p das-driver --lib supported_gpus`"
    );
}

#[test]
fn every_builtin_file_loads() {
    let models = builtin_models().unwrap();
    assert_eq!(models.len(), BUILTIN_MODEL_FILES.len());
    for m in models {
        assert!(!m.source_file.is_empty());
        assert!(m.counter_totals.memory_mib > 0, "{}", m.name);
    }
}

#[test]
fn a100_40gb_table() {
    let m = model("A100-SXM4-40GB");
    assert_eq!(
        (m.memory_slices, m.compute_slices, m.max_gpu_instances),
        (8, 7, 7)
    );
    assert_eq!(placements(&m, "1g.10gb"), (vec![0, 2, 4, 6], 2));
    assert_eq!(placements(&m, "7g.40gb"), (vec![0], 8));
    assert_eq!(placements(&m, "3g.20gb"), (vec![0, 4], 4));
    assert_eq!(placements(&m, "2g.10gb"), (vec![0, 2, 4], 2));
    let (_, p) = m.profile("1g.10gb").unwrap();
    assert_eq!((p.id, p.nvml_enum_value(), p.memory_mib), (15, 9, 9984));
    assert!(m.mig_mode_change_requires_reset());
}

#[test]
fn a30_has_four_slices() {
    let m = model("A30-24GB");
    assert_eq!(
        (m.memory_slices, m.compute_slices, m.max_gpu_instances),
        (4, 4, 4)
    );
    assert_eq!(placements(&m, "4g.24gb"), (vec![0], 4));
    assert_eq!(placements(&m, "2g.12gb+me"), (vec![0, 2], 2));
    assert_eq!(m.profile("1g.6gb").unwrap().1.id, 14);
}

#[test]
fn h100_aliases_and_table() {
    let m = model("h100-80gb");
    assert_eq!(m.name, "H100-SXM5-80GB");
    assert_eq!(placements(&m, "1g.20gb"), (vec![0, 2, 4, 6], 2));
    assert_eq!(placements(&m, "3g.40gb"), (vec![0, 4], 4));
    let (_, seven) = m.profile("7g.80gb").unwrap();
    assert_eq!((seven.multiprocessors, seven.copy_engines), (132, 8));
    assert_eq!(m.profile("1g.20gb").unwrap().1.compute_instance.id, 7);
    assert!(!m.mig_mode_change_requires_reset());
}

#[test]
fn hopper_and_blackwell_models_exist() {
    assert_eq!(
        model("H100-NVL-94GB")
            .profile("7g.94gb")
            .unwrap()
            .1
            .memory_mib,
        95360
    );
    assert_eq!(
        model("H200-141GB").profile("3g.71gb").unwrap().1.memory_mib,
        71424
    );
    assert_eq!(model("B200").profile("2g.45gb").unwrap().1.copy_engines, 4);
    assert_eq!(model("RTX-PRO-6000").memory_slices, 12);
    assert_eq!(
        find_model_for_gpu(0x2330_10DE, 0x16C1_10DE, "NVIDIA H100 80GB HBM3")
            .unwrap()
            .unwrap()
            .name,
        "H100-SXM5-80GB"
    );
}

/// One fact per model from the public captures (docs/reference/mig.md, "The profile tables"): (model, profile, real ID, MiB, SMs, starts, size).
#[test]
fn one_profile_fact_per_model() {
    type Fact = (
        &'static str,
        &'static str,
        u32,
        u64,
        u32,
        &'static [u32],
        u32,
    );
    let facts: &[Fact] = &[
        (
            "A100-SXM4-40GB",
            "1g.5gb",
            19,
            4864,
            14,
            &[0, 1, 2, 3, 4, 5, 6],
            1,
        ),
        ("A100-SXM4-80GB", "1g.20gb", 15, 19968, 14, &[0, 2, 4, 6], 2),
        ("A30-24GB", "2g.12gb", 5, 11968, 28, &[0, 2], 2),
        ("H100-SXM5-80GB", "3g.40gb", 9, 40448, 60, &[0, 4], 4),
        ("H100-PCIE-80GB", "7g.80gb", 0, 81152, 114, &[0], 8),
        ("H100-NVL-94GB", "1g.24gb", 15, 22144, 26, &[0, 2, 4, 6], 2),
        ("GH200-96GB", "2g.24gb", 14, 23552, 32, &[0, 2, 4], 2),
        ("H200-141GB", "7g.141gb", 0, 143360, 132, &[0], 8),
        ("B200-180GB", "1g.45gb", 15, 45312, 30, &[0, 2, 4, 6], 2),
        (
            "RTX-PRO-6000-BLACKWELL",
            "1g.24gb",
            14,
            24192,
            46,
            &[0, 3, 6, 9],
            3,
        ),
    ];
    for &(name, profile, id, mib, sms, starts, size) in facts {
        let m = model(name);
        let (_, p) = m
            .profile(profile)
            .unwrap_or_else(|| panic!("{name}: no {profile}"));
        assert_eq!(
            (
                p.id,
                p.memory_mib,
                p.multiprocessors,
                p.placement_starts.as_slice(),
                p.placement_size
            ),
            (id, mib, sms, starts, size),
            "{name} {profile}"
        );
    }
    let mig_models = builtin_models().unwrap().iter().filter(|m| m.mig).count();
    assert_eq!(facts.len(), mig_models);
}

/// One line per model without MIG, from its data file's sources: (model, NVML name, PCI device
/// ID, architecture, compute capability, MiB, SMs).
#[test]
fn one_fact_line_per_model_without_mig() {
    type Fact = (
        &'static str,
        &'static str,
        u32,
        &'static str,
        &'static str,
        u64,
        u32,
    );
    let facts: &[Fact] = &[
        ("T4", "Tesla T4", 0x1EB8_10DE, "Turing", "7.5", 15360, 40),
        ("A2", "NVIDIA A2", 0x25B6_10DE, "Ampere", "8.6", 15356, 10),
        ("A10", "NVIDIA A10", 0x2236_10DE, "Ampere", "8.6", 23028, 72),
        (
            "A10G",
            "NVIDIA A10G",
            0x2237_10DE,
            "Ampere",
            "8.6",
            23028,
            80,
        ),
        ("A16", "NVIDIA A16", 0x25B6_10DE, "Ampere", "8.6", 15356, 10),
        ("A40", "NVIDIA A40", 0x2235_10DE, "Ampere", "8.6", 46068, 84),
        (
            "L4",
            "NVIDIA L4",
            0x27B8_10DE,
            "Ada Lovelace",
            "8.9",
            23034,
            58,
        ),
        (
            "L40",
            "NVIDIA L40",
            0x26B5_10DE,
            "Ada Lovelace",
            "8.9",
            46068,
            142,
        ),
        (
            "L40S",
            "NVIDIA L40S",
            0x26B9_10DE,
            "Ada Lovelace",
            "8.9",
            46068,
            142,
        ),
        (
            "RTX-6000-ADA",
            "NVIDIA RTX 6000 Ada Generation",
            0x26B1_10DE,
            "Ada Lovelace",
            "8.9",
            49140,
            142,
        ),
    ];
    for &(name, product, pci, arch, cc, mib, sms) in facts {
        let m = model(name);
        assert!(!m.mig, "{name}");
        assert_eq!(
            (
                m.product_name.as_str(),
                m.pci_device_ids.as_slice(),
                m.architecture.as_str(),
                m.cuda_compute_capability.as_str(),
                m.memory_mib,
                m.multiprocessors
            ),
            (product, &[pci][..], arch, cc, mib, Some(sms)),
            "{name}"
        );
    }
    let without_mig = builtin_models().unwrap().iter().filter(|m| !m.mig).count();
    assert_eq!(facts.len(), without_mig);
}

/// A GPU without MIG loads as one memory slice (the whole GPU) with `memory` as its one resource
/// counter, no profiles and no MIG mode to change.
#[test]
fn a_model_without_mig_is_one_unit() {
    let m = model("L4");
    assert_eq!(
        (m.memory_slices, m.compute_slices, m.max_gpu_instances),
        (1, 0, 0)
    );
    assert!(m.profiles.is_empty());
    assert_eq!(m.published_counters, ["memory"]);
    assert!(m.publishes_counter("memory") && !m.publishes_counter("multiprocessors"));
    assert_eq!(
        (
            m.counter_totals.memory_mib,
            m.counter_totals.multiprocessors
        ),
        (23034, 58)
    );
    assert!(!m.mig_mode_change_requires_reset());
    assert_eq!(m.profile_names(), "none (no MIG: served whole)");
    assert!(model("tesla-t4").answers_to("T4"));
}

/// A2 and A16 share PCI device ID 0x25B6: the subsystem ID tells them apart, else the NVML name;
/// a GPU that matches neither has no data file.
#[test]
fn a_shared_device_id_is_told_apart_by_subsystem_or_name() {
    let find = |sub: u32, name: &str| {
        find_model_for_gpu(0x25B6_10DE, sub, name)
            .unwrap()
            .map(|m| m.name.clone())
    };
    assert_eq!(find(0x157E_10DE, "NVIDIA A2").as_deref(), Some("A2"));
    assert_eq!(find(0x14A9_10DE, "NVIDIA A16").as_deref(), Some("A16"));
    // The subsystem decides, whatever the name says.
    assert_eq!(find(0x14A9_10DE, "NVIDIA A2").as_deref(), Some("A16"));
    // An OEM board's subsystem no file lists: the NVML name decides.
    assert_eq!(find(0x1234_1028, "NVIDIA A16").as_deref(), Some("A16"));
    assert_eq!(find(0, "NVIDIA A2").as_deref(), Some("A2"));
    assert_eq!(find(0x1234_1028, "NVIDIA A-something"), None);
    // A device ID one file covers needs no subsystem: every vendor's RTX 6000 Ada board.
    let rtx = |sub| find_model_for_gpu(0x26B1_10DE, sub, "").unwrap().unwrap();
    assert_eq!(rtx(0x16A1_1028).name, "RTX-6000-ADA");
    assert_eq!(rtx(0x16A1_17AA).name, "RTX-6000-ADA");
    assert_eq!(find_model_for_gpu(0xFFFF_10DE, 0, "").unwrap(), None);
}

const L4_FILE: &str = "name = \"X\"\nproduct_name = \"NVIDIA X\"\npci_device_ids = [0x27B810DE]\n\
    architecture = \"Ada Lovelace\"\ncuda_compute_capability = \"8.9\"\nmemory_mib = 23034\n\
    mig = false\nmultiprocessors = 58\n";

/// The rules of a file without MIG: no MIG field, an SM count, NVIDIA's architecture names; each
/// error says what is wrong and what is valid.
#[test]
fn a_file_without_mig_states_no_mig_field() {
    assert!(parse_model("x.toml", L4_FILE).is_ok());
    let problem = |text: &str| parse_model("x.toml", text).unwrap_err().problem;
    let e = problem(&format!(
        "{L4_FILE}memory_slices = 8\nmig_mode_change_requires_reset = false\n"
    ));
    assert!(
        e.contains("mig = false") && e.contains("memory_slices, mig_mode_change_requires_reset"),
        "{e}"
    );
    let e = problem(&L4_FILE.replace("multiprocessors = 58\n", ""));
    assert!(e.contains("needs multiprocessors"), "{e}");
    let e = problem(&L4_FILE.replace("multiprocessors = 58", "multiprocessors = 0"));
    assert!(e.contains("multiprocessors is 0"), "{e}");
    let e = problem(&L4_FILE.replace("\"Ada Lovelace\"", "\"Ada\""));
    assert!(
        e.contains("architecture \"Ada\" is not one of") && e.contains("Ada Lovelace"),
        "{e}"
    );
    let e = problem(&L4_FILE.replace("0x27B810DE", "0x27B81234"));
    assert!(e.contains("0x27b81234") && e.contains("10DE"), "{e}");
    let e = problem(&L4_FILE.replace("memory_mib = 23034", "memory_mib = 0"));
    assert!(e.contains("memory_mib is 0"), "{e}");
    // A MIG file must say whether a mode change needs a reset, and gives no whole-GPU SM count.
    let a100 = BUILTIN_MODEL_FILES[0].1;
    let e = problem(&a100.replace("mig_mode_change_requires_reset = true\n", ""));
    assert!(
        e.contains("mig_mode_change_requires_reset is missing"),
        "{e}"
    );
    let e = problem(&a100.replace(
        "mig_mode_change_requires_reset = true\n",
        "mig_mode_change_requires_reset = true\nmultiprocessors = 108\n",
    ));
    assert!(e.contains("multiprocessors is for GPUs without MIG"), "{e}");
    let e = problem(&L4_FILE.replace(
        "mig = false\nmultiprocessors = 58\n",
        "memory_slices = 1\ncompute_slices = 1\nmax_gpu_instances = 1\nmig_mode_change_requires_reset = false\n",
    ));
    assert!(
        e.contains("no [[profiles]] (a GPU without MIG says mig = false)"),
        "{e}"
    );
}

/// Two files may share a PCI device ID only where their subsystem IDs tell them apart.
#[test]
fn files_that_share_a_device_id_need_distinct_subsystems() {
    let with = |subs: &str| {
        let text = L4_FILE.replace(
            "pci_device_ids = [0x27B810DE]\n",
            &format!("pci_device_ids = [0x27B810DE]\n{subs}"),
        );
        parse_model("x.toml", &text).unwrap()
    };
    let plain = with("");
    let a = with("pci_subsystem_ids = [0x16CA10DE]\n");
    let b = with("pci_subsystem_ids = [0x16EE10DE]\n");
    let ab = with("pci_subsystem_ids = [0x16CA10DE, 0x16EE10DE]\n");
    assert!(
        validate::pci_overlap(&plain, &a),
        "no subsystem list covers every one"
    );
    assert!(!validate::pci_overlap(&a, &b));
    assert!(validate::pci_overlap(&a, &ab));
    let other = L4_FILE.replace("0x27B810DE", "0x26B910DE");
    assert!(!validate::pci_overlap(
        &plain,
        &parse_model("y.toml", &other).unwrap()
    ));
    // The built-in files keep the rule (they load).
    assert!(builtin_models().is_ok());
}

#[test]
fn counter_totals_cover_every_layout() {
    // A100-40GB: 7 × 1g.5gb = 98 SMs = 7g; one JPEG (7g or the single +me).
    let m = model("A100-SXM4-40GB");
    assert_eq!(m.counter_totals.multiprocessors, 98);
    assert_eq!(m.counter_totals.jpeg_engines, 1);
    assert_eq!(m.counter_totals.memory_mib, 40320);
}

#[test]
fn invalid_placement_is_reported_with_file_and_profile() {
    let text = BUILTIN_MODEL_FILES[0].1.replace(
        "placement_starts = [0, 2, 4, 6]",
        "placement_starts = [0, 2, 4, 7]",
    );
    let e = parse_model("broken.toml", &text).unwrap_err();
    assert_eq!(e.file, "broken.toml");
    assert!(e.problem.contains("1g.10gb"), "{e}");
    assert!(e.problem.contains("start 7"), "{e}");
}

#[test]
fn unknown_field_and_bad_toml_are_errors() {
    let e = parse_model("x.toml", "name = ").unwrap_err();
    assert!(
        e.to_string()
            .starts_with("GPU model file x.toml: invalid TOML"),
        "{e}"
    );
    let text = format!("bogus = 1\n{}", BUILTIN_MODEL_FILES[0].1);
    assert!(parse_model("x.toml", &text).is_err());
}
