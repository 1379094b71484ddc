//! The built-in GPU models: the TOML data files in `driver/data/gpus/`, embedded with
//! `include_str!` so the plugin binary is self-contained, parsed and validated on first use (a
//! wrong table fails loudly with the file name and the problem, never silently), and looked up
//! by name, alias or PCI device ID. A new GPU model is a new data file plus a line in
//! [`BUILTIN_MODEL_FILES`] (CONTRIBUTING.md).

use std::collections::{BTreeSet, HashSet};
use std::sync::{Arc, OnceLock};

use super::layout;
use super::model::{
    CI_PROFILE_ENUMS, GI_PROFILE_ENUMS, GiProfile, GpuModel, MAX_MEMORY_SLICES, enum_value,
    parse_compute_capability,
};

/// The embedded data files: `(file name, contents)`.
pub const BUILTIN_MODEL_FILES: &[(&str, &str)] = &[
    (
        "a100-sxm4-40gb.toml",
        include_str!("../../data/gpus/a100-sxm4-40gb.toml"),
    ),
    (
        "a100-sxm4-80gb.toml",
        include_str!("../../data/gpus/a100-sxm4-80gb.toml"),
    ),
    (
        "a30-24gb.toml",
        include_str!("../../data/gpus/a30-24gb.toml"),
    ),
    (
        "h100-sxm5-80gb.toml",
        include_str!("../../data/gpus/h100-sxm5-80gb.toml"),
    ),
    (
        "h100-pcie-80gb.toml",
        include_str!("../../data/gpus/h100-pcie-80gb.toml"),
    ),
    (
        "h100-nvl-94gb.toml",
        include_str!("../../data/gpus/h100-nvl-94gb.toml"),
    ),
    (
        "gh200-96gb.toml",
        include_str!("../../data/gpus/gh200-96gb.toml"),
    ),
    (
        "h200-141gb.toml",
        include_str!("../../data/gpus/h200-141gb.toml"),
    ),
    (
        "b200-180gb.toml",
        include_str!("../../data/gpus/b200-180gb.toml"),
    ),
    (
        "rtx-pro-6000-blackwell.toml",
        include_str!("../../data/gpus/rtx-pro-6000-blackwell.toml"),
    ),
];

/// A data file that does not parse or does not describe a consistent GPU.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("GPU model file {file}: {problem}")]
pub struct ModelError {
    /// The file name, e.g. `a100-sxm4-40gb.toml`.
    pub file: String,
    /// What is wrong, naming the profile and field where it applies.
    pub problem: String,
}

/// Parses and validates one model file. `file` names it in errors.
pub fn parse_model(file: &str, text: &str) -> Result<GpuModel, ModelError> {
    let err = |problem: String| ModelError {
        file: file.to_string(),
        problem,
    };
    let mut model: GpuModel =
        toml::from_str(text).map_err(|e| err(format!("invalid TOML: {e}")))?;
    model.source_file = file.to_string();
    validate_model(&model).map_err(err)?;
    model.counter_totals = layout::max_consumption(&model).ok_or_else(|| {
        err(format!(
            "more than {} valid layouts; the table is too large to derive counters from",
            layout::LAYOUT_BUDGET
        ))
    })?;
    // Past the budget every resource counter stays (empty list): more counters, same layouts.
    model.published_counters = layout::needed_counters(&model).unwrap_or_default();
    Ok(model)
}

fn validate_model(m: &GpuModel) -> Result<(), String> {
    validate_geometry(m)?;
    if m.profiles.is_empty() {
        return Err("no [[profiles]]".into());
    }
    let mut ids = HashSet::new();
    let mut labels = HashSet::new();
    for p in &m.profiles {
        validate_profile(m, p).map_err(|e| format!("profile {}: {e}", p.name))?;
        if !ids.insert(p.id) {
            return Err(format!("profile id {} appears twice", p.id));
        }
        if !labels.insert(p.dns_label()) {
            return Err(format!(
                "profile {} maps to the device-name label {} of another profile",
                p.name,
                p.dns_label()
            ));
        }
    }
    Ok(())
}

fn validate_geometry(m: &GpuModel) -> Result<(), String> {
    if m.name.trim().is_empty() {
        return Err("empty name".into());
    }
    if m.memory_slices == 0 || m.memory_slices > MAX_MEMORY_SLICES {
        return Err(format!(
            "memory_slices = {} (must be 1..={MAX_MEMORY_SLICES}: one counter per memory slice, 32 counters per set)",
            m.memory_slices
        ));
    }
    if m.compute_slices == 0 || m.max_gpu_instances == 0 {
        return Err("compute_slices and max_gpu_instances must be positive".into());
    }
    if m.pci_device_ids.is_empty() {
        return Err("pci_device_ids is empty".into());
    }
    parse_compute_capability(&m.cuda_compute_capability).ok_or_else(|| {
        format!(
            "cuda_compute_capability {:?} is not <major>.<minor>",
            m.cuda_compute_capability
        )
    })?;
    Ok(())
}

fn validate_profile(m: &GpuModel, p: &GiProfile) -> Result<(), String> {
    if enum_value(GI_PROFILE_ENUMS, &p.nvml_enum).is_none() {
        return Err(format!("unknown GI profile enum {}", p.nvml_enum));
    }
    if enum_value(CI_PROFILE_ENUMS, &p.compute_instance.nvml_enum) != Some(p.compute_instance.id) {
        return Err(format!(
            "compute_instance id {} does not match enum {}",
            p.compute_instance.id, p.compute_instance.nvml_enum
        ));
    }
    if !p.name.starts_with(&format!("{}g.", p.compute_slices)) {
        return Err(format!(
            "name does not start with {}g. (compute_slices)",
            p.compute_slices
        ));
    }
    if p.compute_slices == 0 || p.compute_slices > m.compute_slices {
        return Err(format!(
            "compute_slices {} outside 1..={}",
            p.compute_slices, m.compute_slices
        ));
    }
    if p.media_extension != p.name.ends_with("+me") {
        return Err("media_extension must be true exactly for `+me` profiles".into());
    }
    if p.max_instances == 0 || p.max_instances > m.max_gpu_instances {
        return Err(format!(
            "max_instances {} outside 1..={}",
            p.max_instances, m.max_gpu_instances
        ));
    }
    validate_placements(m, p)?;
    validate_memory(m, p)
}

fn validate_placements(m: &GpuModel, p: &GiProfile) -> Result<(), String> {
    if p.placement_size == 0 || p.placement_size > m.memory_slices {
        return Err(format!(
            "placement_size {} outside 1..={} memory slices",
            p.placement_size, m.memory_slices
        ));
    }
    if p.placement_starts.is_empty() {
        return Err("placement_starts is empty".into());
    }
    if !p.placement_starts.windows(2).all(|w| w[0] < w[1]) {
        return Err(format!(
            "placement_starts {:?} not strictly ascending",
            p.placement_starts
        ));
    }
    if let Some(s) = p
        .placement_starts
        .iter()
        .find(|&&s| s + p.placement_size > m.memory_slices)
    {
        return Err(format!(
            "placement start {s} + size {} exceeds the {} memory slices",
            p.placement_size, m.memory_slices
        ));
    }
    Ok(())
}

/// A profile's memory must not exceed its share of the GPU: `memory × slices ≤ total × size`.
fn validate_memory(m: &GpuModel, p: &GiProfile) -> Result<(), String> {
    if p.memory_mib == 0 {
        return Err("memory_mib is 0".into());
    }
    let share = m.memory_mib * u64::from(p.placement_size);
    if p.memory_mib * u64::from(m.memory_slices) > share {
        return Err(format!(
            "memory_mib {} exceeds {}/{} of the GPU's {} MiB",
            p.memory_mib, p.placement_size, m.memory_slices, m.memory_mib
        ));
    }
    Ok(())
}

/// Parses and validates every embedded data file. Names and aliases must be unique across files.
pub fn load_builtin_models() -> Result<Vec<Arc<GpuModel>>, ModelError> {
    let mut models = Vec::new();
    let mut names = BTreeSet::new();
    for (file, text) in BUILTIN_MODEL_FILES {
        let model = parse_model(file, text)?;
        for n in std::iter::once(&model.name).chain(&model.aliases) {
            if !names.insert(n.to_ascii_uppercase()) {
                return Err(ModelError {
                    file: file.to_string(),
                    problem: format!("name or alias {n} is used by another model"),
                });
            }
        }
        models.push(Arc::new(model));
    }
    Ok(models)
}

/// The embedded GPU models, loaded and validated once.
pub fn builtin_models() -> Result<&'static [Arc<GpuModel>], ModelError> {
    static MODELS: OnceLock<Result<Vec<Arc<GpuModel>>, ModelError>> = OnceLock::new();
    MODELS
        .get_or_init(load_builtin_models)
        .as_ref()
        .map(Vec::as_slice)
        .map_err(Clone::clone)
}

/// The embedded model called `name` (or with that alias), ASCII case-insensitive.
pub fn find_model(name: &str) -> Result<Option<Arc<GpuModel>>, ModelError> {
    Ok(builtin_models()?
        .iter()
        .find(|m| m.answers_to(name))
        .cloned())
}

/// The embedded model for PCI device ID `pci_device_id` (`0xDDDDVVVV`).
pub fn find_model_by_pci_id(pci_device_id: u32) -> Result<Option<Arc<GpuModel>>, ModelError> {
    Ok(builtin_models()?
        .iter()
        .find(|m| m.pci_device_ids.contains(&pci_device_id))
        .cloned())
}

/// One line per embedded model, `NAME (aliases: …): profiles …`, for docs and error messages.
pub fn model_list() -> Result<Vec<String>, ModelError> {
    Ok(builtin_models()?
        .iter()
        .map(|m| {
            let aliases = if m.aliases.is_empty() {
                String::new()
            } else {
                format!(" (aliases: {})", m.aliases.join(", "))
            };
            format!("{}{aliases}: {}", m.name, m.profile_names())
        })
        .collect())
}

/// The embedded model names, comma-separated.
pub fn model_names() -> Result<String, ModelError> {
    Ok(builtin_models()?
        .iter()
        .map(|m| m.name.as_str())
        .collect::<Vec<_>>()
        .join(", "))
}

#[cfg(test)]
mod tests {
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
                    "DAS can switch it (`enableMigMode`)"
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
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/supported-gpus.md");
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
            71168
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
            ("H200-141GB", "7g.141gb", 0, 143104, 132, &[0], 8),
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
}
