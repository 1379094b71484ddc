//! Property tests of every parser of untrusted bytes in the node plugin: the checkpoint file,
//! the emulated GPUs' state and control files, CDI spec files, the NVIDIA container toolkit's
//! config (read at start-up on real GPUs), and the `--emulated-gpus` flag.
//! Any input: no panic, and a clear outcome (loaded, moved aside, or an error that says why).
//! `make test` runs a fixed number of cases; `make fuzz` runs many more (PROPTEST_CASES).

use std::collections::BTreeMap;

use das_driver::claims::cdi;
use das_driver::claims::checkpoint::{
    CHECKPOINT_FILE_NAME, Checkpoint, InstanceId, LoadOutcome, RecordedDevice,
};
use das_driver::gpu::{EmulatedBackend, GpuBackend, parse_emulated_spec};
use das_driver::node_checks::{self, Check, EnvvarSetting};
use proptest::prelude::*;

const BOOT: &str = "boot-1";

fn valid_checkpoint() -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(CHECKPOINT_FILE_NAME);
    let mut cp = Checkpoint::new(BOOT);
    let device = RecordedDevice {
        time_slice: None,
        acquired: false,
        kind: Default::default(),
        request: "gpu".into(),
        pool: "n0".into(),
        device: "gpu-0-mig-1g-10gb-6".into(),
        gpu_index: 0,
        gpu_uuid: "GPU-a".into(),
        profile: "1g.10gb".into(),
        placement_start: 6,
        placement_size: 1,
        instance: Some(InstanceId {
            gi_id: 3,
            ci_id: 0,
            mig_uuid: "MIG-x".into(),
        }),
        // An MPS device (version 6), so the parser's cases cover its field too.
        mps: Some(das_driver::mps::MpsLimits {
            active_thread_percentage: Some(50),
            pinned_device_memory_limit_mib: Some(2048),
        }),
        // A share (version 7), likewise.
        share: Some(das_driver::claims::checkpoint::Share {
            id: "5f0c2a1e-0000-4000-8000-000000000001".into(),
            shares: 1,
            of: 4,
            memory_bytes: 1 << 30,
        }),
    };
    cp.set_completed("uid-1", "ns", "c", vec![device.clone()], BTreeMap::new());
    cp.set_releasing("uid-2", "ns", "d", vec![device]);
    cp.save(&path).unwrap();
    std::fs::read(&path).unwrap()
}

/// Loads `bytes` as a checkpoint: never panics, and anything but a valid file is moved aside.
fn load(bytes: &[u8]) -> LoadOutcome {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(CHECKPOINT_FILE_NAME);
    std::fs::write(&path, bytes).unwrap();
    let outcome = Checkpoint::load(&path, BOOT).expect("bad content is never an I/O error");
    if let LoadOutcome::Corrupt { moved_to, .. } = &outcome {
        assert!(moved_to.exists() && !path.exists());
    }
    outcome
}

proptest! {
    #[test]
    fn any_bytes_as_a_checkpoint(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let _ = load(&bytes);
    }

    /// A valid file with bytes changed, dropped or cut off: loaded only if it still checks.
    #[test]
    fn a_damaged_checkpoint(edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
                            cut in any::<prop::sample::Index>()) {
        let mut bytes = valid_checkpoint();
        for (at, b) in edits {
            let i = at.index(bytes.len());
            bytes[i] = b;
        }
        let keep = cut.index(bytes.len() + 1).max(bytes.len() / 2);
        bytes.truncate(keep);
        match load(&bytes) {
            LoadOutcome::Loaded(cp) | LoadOutcome::Upgraded { checkpoint: cp, .. } => {
                // Only a change the checksum cannot see (whitespace) loads; the data is intact.
                prop_assert_eq!(cp.claims.len(), 2);
            }
            LoadOutcome::Corrupt { .. } | LoadOutcome::NewBoot { .. } | LoadOutcome::Fresh => {}
        }
    }

    #[test]
    fn any_emulated_gpu_flag(spec in "\\PC{0,40}") {
        if let Ok(gpus) = parse_emulated_spec(&spec) {
            let total: u32 = gpus.iter().map(|g| g.count).sum();
            prop_assert!((1..=32).contains(&total));
        }
    }

    #[test]
    fn emulated_gpu_flags_of_model_names(models in proptest::collection::vec(
        ("(A100-SXM4-40GB|H100-80GB|a30|H200|nope|)", "(:[0-9]{0,3})?"), 1..5)) {
        let spec: Vec<String> = models.iter().map(|(m, c)| format!("{m}{c}")).collect();
        let _ = parse_emulated_spec(&spec.join(","));
    }

    /// Any bytes as the emulated GPUs' state: an error that says why, or a usable backend.
    #[test]
    fn any_bytes_as_emulated_state(bytes in proptest::collection::vec(any::<u8>(), 0..1024)) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(das_driver::gpu::emulated::STATE_FILE), &bytes).unwrap();
        if let Ok(b) = EmulatedBackend::open("A30:1", "n0", dir.path()) {
            prop_assert!(b.all_instances().is_ok());
        }
    }

    /// A valid state whose instances were edited: refused unless it is a layout the GPU takes.
    #[test]
    fn edited_emulated_instances(instances in proptest::collection::vec(
        (0u32..20, 0u32..3, "(1g.6gb|2g.12gb|4g.24gb|1g.6gb\\+me|9g.9gb)", 0u32..6), 0..6)) {
        let dir = tempfile::tempdir().unwrap();
        drop(EmulatedBackend::open("A30:1", "n0", dir.path()).unwrap());
        let path = dir.path().join(das_driver::gpu::emulated::STATE_FILE);
        let mut state: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        state["gpus"][0]["instances"] = instances.iter().map(|(gi, ci, profile, start)| serde_json::json!({
            "giId": gi, "ciId": ci, "profile": profile, "start": start,
            "migUuid": format!("MIG-{gi}"), "createdByDas": true})).collect();
        std::fs::write(&path, serde_json::to_vec(&state).unwrap()).unwrap();
        if let Ok(b) = EmulatedBackend::open("A30:1", "n0", dir.path()) {
            prop_assert_eq!(b.all_instances().unwrap().len(), instances.len());
        }
    }

    /// Any bytes as the control file: ignored with a log line, the backend keeps working.
    #[test]
    fn any_bytes_as_the_control_file(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let dir = tempfile::tempdir().unwrap();
        let b = EmulatedBackend::open("A30:1", "n0", dir.path()).unwrap();
        std::fs::write(dir.path().join(das_driver::gpu::emulated::CONTROL_FILE), &bytes).unwrap();
        let _ = b.inventory();
        let _ = b.instances_on(0);
    }

    /// Any bytes as a CDI spec file: a parse error naming the file, or a spec whose validation
    /// answers (it is what start-up reads back).
    #[test]
    fn any_bytes_as_a_cdi_spec(bytes in proptest::collection::vec(any::<u8>(), 0..1024)) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("das.com-mig_x.json");
        std::fs::write(&path, &bytes).unwrap();
        match cdi::read_spec(&path) {
            Ok(spec) => { let _ = spec.validate(); }
            Err(e) => prop_assert!(e.to_string().contains("das.com-mig_x.json")),
        }
    }

    /// CDI specs of any shape that parse: validation never panics.
    #[test]
    fn any_cdi_spec_json(version in "[0-9.]{0,8}", kind in "\\PC{0,20}",
                         names in proptest::collection::vec("\\PC{0,12}", 0..4)) {
        let spec = serde_json::json!({"cdiVersion": version, "kind": kind,
            "devices": names.iter().map(|n| serde_json::json!({"name": n, "containerEdits": {"env": ["A=B"]}})).collect::<Vec<_>>()});
        if let Ok(s) = serde_json::from_value::<cdi::Spec>(spec) {
            let _ = s.validate();
            let _ = s.minimum_version();
        }
    }

    /// Any bytes as the toolkit's config file: a finding that names the file, never a panic;
    /// only a well-formed `false` is no finding.
    #[test]
    fn any_bytes_as_a_toolkit_config(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let root = tempfile::tempdir().unwrap();
        let rel = node_checks::TOOLKIT_CONFIG_FILES[0];
        std::fs::create_dir_all(root.path().join(rel).parent().unwrap()).unwrap();
        std::fs::write(root.path().join(rel), &bytes).unwrap();
        let problems = node_checks::check_toolkit_configs(root.path());
        let refused = std::str::from_utf8(&bytes)
            .is_ok_and(|t| node_checks::envvar_setting(t) == EnvvarSetting::Refused);
        prop_assert_eq!(problems.is_empty(), refused);
        for p in problems {
            prop_assert_eq!(p.check, Check::VisibleDevicesEnvvar);
            prop_assert!(p.note.contains("/etc/nvidia-container-runtime/config.toml"));
        }
    }

    /// Toolkit configs of lines around the key: refused only by a top-level boolean `false`.
    #[test]
    fn toolkit_configs_around_the_key(lines in proptest::collection::vec(
        "(accept-nvidia-visible-devices-envvar-when-unprivileged ?= ?(true|false|\"false\"|1|)|\\[nvidia-container-cli\\]|x = 1)", 0..6)) {
        let text = lines.join("\n");
        if node_checks::envvar_setting(&text) == EnvvarSetting::Refused {
            let top_level = text.split("[nvidia-container-cli]").next().unwrap_or_default();
            prop_assert!(top_level.replace(' ', "").contains("unprivileged=false"), "{}", text);
        }
    }
}
