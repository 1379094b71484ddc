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

/// The table of docs/supported-gpus.md, from the data files.
fn supported_gpus_table() -> String {
    let mut out = String::from(
        "| model (`--emulated-gpus`) | NVML name | PCI device IDs | architecture | memory slices | most GPU instances | MIG mode change | profiles (`nvidia.com/mig-<name>`) |\n|---|---|---|---|---|---|---|---|\n",
    );
    let mut models: Vec<_> = builtin_models().unwrap().iter().collect();
    models.sort_by(|a, b| a.name.cmp(&b.name));
    for m in models {
        let ids: Vec<String> = m
            .pci_device_ids
            .iter()
            .map(|i| format!("`0x{i:08X}`"))
            .collect();
        let profiles: Vec<String> = m
            .profiles
            .iter()
            .map(|p| format!("`{}`", das_api::legacy_profile_name(&p.name)))
            .collect();
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | {} | {} | {} | {} |\n",
            m.name,
            m.product_name,
            ids.join(", "),
            m.architecture,
            m.memory_slices,
            m.max_gpu_instances,
            if m.mig_mode_change_requires_reset {
                "needs a GPU reset"
            } else {
                "DAS can switch it (`enableMigMode`, `wholeGpus.switchMigMode`)"
            },
            profiles.join(", ")
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
    assert!(m.mig_mode_change_requires_reset);
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
    assert!(!m.mig_mode_change_requires_reset);
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
        find_model_by_pci_id(0x2330_10DE).unwrap().unwrap().name,
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
    assert_eq!(facts.len(), builtin_models().unwrap().len());
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
