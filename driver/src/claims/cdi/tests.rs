//! Unit tests of [`super`] (`cdi/`): the spec's shape and rules, and its files.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::PathBuf;

use serde_json::json;

use super::files::{dir_file_names, temp_file_name};
use super::*;

mod mps;

const UID: &str = "8f2c1a7e-0b1d-4c55-9a0e-3d2f6b7c8d9e";

fn instance(n: u32, parent: u32) -> PreparedInstance {
    PreparedInstance {
        mig_uuid: format!("MIG-0000000{n}-aaaa-bbbb-cccc-dddddddddddd"),
        parent_minor: parent,
        gi_cap_minor: 3 + 135 * parent + 9 * n,
        ci_cap_minor: 3 + 135 * parent + 9 * n + 1,
        caps_major: 508,
        caps_file_mode: None,
        request: "gpu".into(),
        index: 0,
    }
}

fn device(key: &str, instances: Vec<PreparedInstance>) -> SpecDevice {
    SpecDevice {
        key: key.to_string(),
        instances,
        gpus: Vec::new(),
        mps: None,
        hooks: Vec::new(),
    }
}

/// Device `n` of request `request`, on GPU `parent`.
fn one(request: &str, index: usize, n: u32, parent: u32) -> SpecDevice {
    let s = PreparedInstance {
        request: request.into(),
        index,
        ..instance(n, parent)
    };
    device(&format!("gpu-{parent}-mig-1g-10gb-{n}"), vec![s])
}

/// Whole GPU `gpu-<minor>` for position `index` of `request`.
fn whole(request: &str, index: usize, minor: u32) -> SpecDevice {
    SpecDevice {
        key: format!("gpu-{minor}"),
        instances: Vec::new(),
        gpus: vec![PreparedGpu {
            gpu_uuid: format!("GPU-0000000{minor}-aaaa-bbbb-cccc-dddddddddddd"),
            minor,
            request: request.into(),
            index,
        }],
        mps: None,
        hooks: Vec::new(),
    }
}

/// A whole GPU (docs/design.md §7, "Whole GPUs"): its `/dev/nvidia<N>`, no capability nodes,
/// `DAS_GPU_UUID_…` named as `DAS_MIG_UUID_…` is, and the spec-level edits of every DAS spec.
#[test]
fn a_whole_gpu_has_its_device_node_and_uuid_and_no_capabilities() {
    let built = build_claim_spec(UID, &[whole("big/full", 0, 3), one("big", 1, 1, 0)]).unwrap();
    let value = serde_json::to_value(&built.spec).unwrap();
    assert_eq!(
        value["devices"][0],
        json!({
            "name": format!("{UID}-gpu-3"),
            "containerEdits": {
                "env": [
                    "DAS_GPU_UUID_8f2c1a7e_0b1d_4c55_9a0e_3d2f6b7c8d9e_big_full_0=GPU-00000003-aaaa-bbbb-cccc-dddddddddddd"
                ],
                "deviceNodes": [{"path": "/dev/nvidia3"}]
            }
        })
    );
    assert_eq!(
        value["containerEdits"]["env"],
        json!(["NVIDIA_VISIBLE_DEVICES=void"])
    );
    assert_eq!(
        gpu_uuid_env_key(UID, "a-b/c.d", 2),
        "DAS_GPU_UUID_8f2c1a7e_0b1d_4c55_9a0e_3d2f6b7c8d9e_a_b_c_d_2"
    );
    assert_eq!(built.device_ids.len(), 2);
    // A bad GPU UUID is refused like a bad MIG UUID.
    let mut bad = whole("big", 0, 3);
    bad.gpus[0].gpu_uuid = "GPU-1,GPU-2".into();
    let e = build_claim_spec(UID, &[bad]).unwrap_err();
    assert!(e.to_string().contains("GPU UUID"), "{e}");
}

#[test]
fn one_slice_claim_has_the_documented_shape() {
    let built = build_claim_spec(UID, &[one("gpu", 0, 1, 0)]).unwrap();
    let value = serde_json::to_value(&built.spec).unwrap();
    let expected = json!({
        "cdiVersion": "0.5.0",
        "kind": "das.com/mig",
        "devices": [{
            "name": format!("{UID}-gpu-0-mig-1g-10gb-1"),
            "containerEdits": {
                "env": [
                    "DAS_MIG_UUID_8f2c1a7e_0b1d_4c55_9a0e_3d2f6b7c8d9e_gpu_0=MIG-00000001-aaaa-bbbb-cccc-dddddddddddd"
                ],
                "deviceNodes": [
                    {"path": "/dev/nvidia0"},
                    {"path": "/dev/nvidia-caps/nvidia-cap12", "type": "c", "major": 508, "minor": 12},
                    {"path": "/dev/nvidia-caps/nvidia-cap13", "type": "c", "major": 508, "minor": 13}
                ]
            }
        }],
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "deviceNodes": [
                {"path": "/dev/nvidiactl"},
                {"path": "/dev/nvidia-uvm"},
                {"path": "/dev/nvidia-uvm-tools"}
            ]
        }
    });
    assert_eq!(value, expected);
    assert_eq!(
        built.device_ids,
        BTreeMap::from([(
            "gpu-0-mig-1g-10gb-1".to_string(),
            format!("das.com/mig={UID}-gpu-0-mig-1g-10gb-1")
        )])
    );
}

/// What a runtime does with the edits of several CDI devices (container-device-interface
/// `ContainerEdits.Apply`): environment merged by key, last one wins; device nodes by path.
fn merge(specs: &[&Spec]) -> (BTreeMap<String, String>, BTreeSet<String>, Vec<String>) {
    let mut env = BTreeMap::new();
    let mut nodes = BTreeSet::new();
    let mut conflicts = Vec::new();
    let mut apply = |e: &ContainerEdits| {
        for kv in &e.env {
            let (k, v) = kv.split_once('=').unwrap();
            if let Some(old) = env.insert(k.to_string(), v.to_string())
                && old != v
            {
                conflicts.push(k.to_string());
            }
        }
        nodes.extend(e.device_nodes.iter().map(|n| n.path.clone()));
    };
    for spec in specs {
        for d in &spec.devices {
            spec.container_edits.iter().for_each(&mut apply);
            apply(&d.container_edits);
        }
    }
    (env, nodes, conflicts)
}

/// Issue 11 finding 4: a container with devices from two claims, and a claim with two
/// requests, sees every MIG UUID; no key is set to two values.
#[test]
fn devices_of_several_claims_and_requests_compose_in_one_container() {
    const UID2: &str = "11111111-2222-3333-4444-555555555555";
    let a = build_claim_spec(UID, &[one("gpu", 0, 1, 0), one("gpu", 1, 2, 1)]).unwrap();
    let b = build_claim_spec(UID2, &[one("small", 0, 3, 0), one("big", 0, 4, 1)]).unwrap();
    let (env, nodes, conflicts) = merge(&[&a.spec, &b.spec]);
    assert!(
        conflicts.is_empty(),
        "keys set to two values: {conflicts:?}"
    );
    let uuids: BTreeSet<&str> = env
        .iter()
        .filter(|(k, _)| k.starts_with(MIG_UUID_ENV_PREFIX))
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(uuids.len(), 4, "{env:?}");
    for n in 1..=4 {
        assert!(
            uuids.contains(instance(n, 0).mig_uuid.as_str()),
            "{n}: {env:?}"
        );
    }
    assert_eq!(env["NVIDIA_VISIBLE_DEVICES"], "void");
    assert!(!env.contains_key("CUDA_VISIBLE_DEVICES"));
    for n in [1, 2, 3, 4] {
        let parent = if n % 2 == 1 { 0 } else { 1 };
        let gi = 3 + 135 * parent + 9 * n;
        assert!(
            nodes.contains(&format!("/dev/nvidia-caps/nvidia-cap{gi}")),
            "{nodes:?}"
        );
    }
    assert!(nodes.contains("/dev/nvidia0") && nodes.contains("/dev/nvidia1"));
}

#[test]
fn env_keys_are_unique_per_claim_request_and_slice_and_valid_names() {
    let k = mig_uuid_env_key(UID, "gpu-a", 2);
    assert_eq!(
        k,
        "DAS_MIG_UUID_8f2c1a7e_0b1d_4c55_9a0e_3d2f6b7c8d9e_gpu_a_2"
    );
    assert!(k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
    assert_ne!(k, mig_uuid_env_key(UID, "gpu-a", 1));
    assert_ne!(k, mig_uuid_env_key(UID, "gpu-b", 2));
    assert_ne!(
        k,
        mig_uuid_env_key("11111111-2222-3333-4444-555555555555", "gpu-a", 2)
    );
}

#[test]
fn without_device_nodes_keeps_the_environment_and_validates() {
    let mut built = build_claim_spec(UID, &[one("gpu", 0, 1, 0)]).unwrap();
    let env = built.spec.devices[0].container_edits.env.clone();
    without_device_nodes(&mut built.spec);
    let edits = &built.spec.devices[0].container_edits;
    assert!(edits.device_nodes.is_empty());
    assert_eq!(edits.env, env);
    built.spec.validate().unwrap();
    let value = serde_json::to_value(&built.spec).unwrap();
    assert!(value["devices"][0]["containerEdits"]["deviceNodes"].is_null());
    assert!(value["containerEdits"]["deviceNodes"].is_null());
    assert_eq!(
        value["containerEdits"]["env"][0],
        "NVIDIA_VISIBLE_DEVICES=void"
    );
}

#[test]
fn stand_in_device_nodes_keep_their_container_paths_and_point_at_the_directory() {
    let host = build_claim_spec(UID, &[one("gpu", 0, 1, 0)]).unwrap();
    let mut stand_in = host.clone();
    place_device_nodes(
        &mut stand_in.spec,
        &DeviceNodes::StandIn(PathBuf::from("/run/das/dev")),
    );
    stand_in.spec.validate().unwrap();
    let pairs = |spec: &Spec| -> Vec<(String, Option<String>)> {
        spec.devices
            .iter()
            .map(|d| &d.container_edits)
            .chain(spec.container_edits.as_ref())
            .flat_map(|e| e.device_nodes.iter())
            .map(|n| (n.path.clone(), n.host_path.clone()))
            .collect()
    };
    let host_pairs = pairs(&host.spec);
    assert!(
        host_pairs.iter().all(|(_, h)| h.is_none()),
        "{host_pairs:?}"
    );
    let moved = pairs(&stand_in.spec);
    assert_eq!(moved.len(), host_pairs.len());
    for (path, host_path) in &moved {
        let rest = path.strip_prefix("/dev/").expect("a /dev node");
        assert_eq!(
            host_path.as_deref(),
            Some(format!("/run/das/dev/{rest}").as_str())
        );
    }
    assert!(moved.iter().any(|(p, _)| p == "/dev/nvidia0"));
    // hostPath needs CDI 0.5.0; the numbers and the environment stay as built.
    assert_eq!(stand_in.spec.cdi_version, "0.5.0");
    assert_eq!(
        stand_in.spec.devices[0].container_edits.env,
        host.spec.devices[0].container_edits.env
    );
    let mut omitted = host.clone();
    place_device_nodes(&mut omitted.spec, &DeviceNodes::Omitted);
    assert!(pairs(&omitted.spec).is_empty());
}

#[test]
fn a_legacy_request_device_lists_every_slice_and_dedups_parents() {
    let instances: Vec<PreparedInstance> = [(1, 0), (2, 1), (3, 0)]
        .into_iter()
        .enumerate()
        .map(|(i, (n, p))| PreparedInstance {
            index: i,
            ..instance(n, p)
        })
        .collect();
    let built = build_claim_spec(UID, &[device("big", instances.clone())]).unwrap();
    let device = &built.spec.devices[0];
    assert_eq!(device.container_edits.env.len(), 3);
    for (i, s) in instances.iter().enumerate() {
        assert_eq!(
            device.container_edits.env[i],
            format!("{}={}", mig_uuid_env_key(UID, "gpu", i), s.mig_uuid)
        );
    }
    let paths: Vec<&str> = device
        .container_edits
        .device_nodes
        .iter()
        .map(|n| n.path.as_str())
        .collect();
    assert_eq!(
        paths,
        vec![
            "/dev/nvidia0",
            "/dev/nvidia1",
            "/dev/nvidia-caps/nvidia-cap12",
            "/dev/nvidia-caps/nvidia-cap13",
            "/dev/nvidia-caps/nvidia-cap156",
            "/dev/nvidia-caps/nvidia-cap157",
            "/dev/nvidia-caps/nvidia-cap30",
            "/dev/nvidia-caps/nvidia-cap31",
        ]
    );
    let caps = &device.container_edits.device_nodes[2];
    assert_eq!(caps.node_type.as_deref(), Some("c"));
    assert_eq!((caps.major, caps.minor), (Some(508), Some(12)));
}

#[test]
fn one_device_per_allocated_device_and_subrequest_names_are_valid() {
    let built = build_claim_spec(
        UID,
        &[
            device("a", vec![instance(1, 0)]),
            device("b/small", vec![instance(2, 0)]),
        ],
    )
    .unwrap();
    let names: Vec<&str> = built.spec.devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, vec![format!("{UID}-a"), format!("{UID}-b.small")]);
    assert_eq!(
        built.device_ids["b/small"],
        format!("das.com/mig={UID}-b.small")
    );
}

#[test]
fn caps_file_mode_is_written_when_known() {
    let mut s = instance(1, 0);
    s.caps_file_mode = Some(0o444);
    let built = build_claim_spec(UID, &[device("gpu", vec![s])]).unwrap();
    let value = serde_json::to_value(&built.spec).unwrap();
    assert_eq!(
        value["devices"][0]["containerEdits"]["deviceNodes"][1]["fileMode"],
        292
    );
}

#[test]
fn minimum_version_follows_features() {
    let letter_uid = "c0ffee00-0000-4000-8000-000000000000";
    let mut spec = build_claim_spec(letter_uid, &[device("gpu", vec![instance(1, 0)])])
        .unwrap()
        .spec;
    // The dot of `das.com/mig` is in the vendor, not the class: no 0.6.0.
    assert_eq!(spec.minimum_version(), "0.3.0");
    assert_eq!(spec.cdi_version, "0.3.0");
    spec.devices[0].container_edits.mounts.push(Mount {
        host_path: "/a".into(),
        container_path: "/b".into(),
        options: vec![],
        mount_type: Some("bind".into()),
    });
    assert_eq!(spec.minimum_version(), "0.4.0");
    spec.devices[0].container_edits.device_nodes[0].host_path = Some("/dev/x".into());
    assert_eq!(spec.minimum_version(), "0.5.0");
    spec.kind = "example.com/gpu.mig".into();
    assert_eq!(spec.minimum_version(), "0.6.0");
    spec.kind = das_api::CDI_KIND.into();
    spec.annotations.insert("a".into(), "b".into());
    assert_eq!(spec.minimum_version(), "0.6.0");
}

#[test]
fn digit_first_device_name_needs_050() {
    let spec = build_claim_spec("1abc", &[device("gpu", vec![instance(1, 0)])])
        .unwrap()
        .spec;
    assert_eq!(spec.cdi_version, "0.5.0");
}

#[test]
fn validate_rejects_old_or_unknown_versions() {
    let mut spec = build_claim_spec(UID, &[device("gpu", vec![instance(1, 0)])])
        .unwrap()
        .spec;
    spec.cdi_version = "0.3.0".into();
    assert!(matches!(spec.validate(), Err(CdiError::InvalidSpec(m)) if m.contains("0.5.0")));
    spec.cdi_version = "0.9.0".into();
    assert!(matches!(spec.validate(), Err(CdiError::InvalidSpec(m)) if m.contains("unknown")));
    spec.cdi_version = "1.1.0".into();
    assert!(spec.validate().is_ok());
}

#[test]
fn names_follow_cdi_rules() {
    assert!(validate_kind("das.com/mig").is_ok());
    assert!(validate_kind("das.com").is_err());
    assert!(validate_kind("1das.com/mig").is_err());
    assert!(validate_kind("das.com/mig-").is_err());
    assert!(validate_kind("das.com/m:g").is_err());
    assert!(validate_device_name("0a:b_c.d-e").is_ok());
    assert!(validate_device_name("").is_err());
    assert!(validate_device_name("-a").is_err());
    assert!(validate_device_name("a-").is_err());
    assert!(validate_device_name("a/b").is_err());
    let err = device_name("../etc", "gpu").unwrap_err().to_string();
    assert!(err.contains("claim UID"), "{err}");
    assert!(device_name(UID, "gpu_").is_err());
}

#[test]
fn builder_rejects_bad_input() {
    assert!(build_claim_spec(UID, &[]).is_err());
    assert!(build_claim_spec(UID, &[device("gpu", vec![])]).is_err());
    let twice = [
        device("gpu", vec![instance(1, 0)]),
        device("gpu", vec![instance(2, 0)]),
    ];
    assert!(build_claim_spec(UID, &twice).is_err());
    let mut s = instance(1, 0);
    s.mig_uuid = "MIG-a,MIG-b".into();
    assert!(build_claim_spec(UID, &[device("gpu", vec![s])]).is_err());
}

#[test]
fn write_read_list_delete_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let built = build_claim_spec(UID, &[device("gpu", vec![instance(1, 0)])]).unwrap();
    let path = write_spec(dir.path(), UID, &built.spec).unwrap();
    assert_eq!(path, dir.path().join(format!("das.com-mig_{UID}.json")));
    assert_eq!(read_spec(&path).unwrap(), built.spec);
    // Only the spec is left: the temp file was renamed away.
    let names = dir_file_names(dir.path()).unwrap();
    assert_eq!(names, vec![format!("das.com-mig_{UID}.json")]);
    // Another vendor's spec is not listed.
    fs::write(dir.path().join("example.com-gpu_x.json"), b"{}").unwrap();
    let listed = list_specs(dir.path()).unwrap();
    assert_eq!(
        listed,
        vec![SpecFile {
            claim_uid: UID.into(),
            path: path.clone()
        }]
    );
    // Rewriting replaces the file in place.
    write_spec(dir.path(), UID, &built.spec).unwrap();
    assert_eq!(list_specs(dir.path()).unwrap().len(), 1);
    assert!(delete_spec(dir.path(), UID).unwrap());
    assert!(!delete_spec(dir.path(), UID).unwrap());
    assert!(list_specs(dir.path()).unwrap().is_empty());
}

#[test]
fn invalid_spec_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = build_claim_spec(UID, &[device("gpu", vec![instance(1, 0)])])
        .unwrap()
        .spec;
    spec.devices.clear();
    assert!(write_spec(dir.path(), UID, &spec).is_err());
    assert!(dir_file_names(dir.path()).unwrap().is_empty());
}

#[test]
fn corrupt_spec_is_a_parse_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = spec_path(dir.path(), UID);
    fs::write(&path, b"{\"cdiVersion\": \"0.3.0\", \"kind\": ").unwrap();
    let err = read_spec(&path).unwrap_err();
    assert!(matches!(err, CdiError::Parse { .. }));
    assert!(err.to_string().contains("corrupt"), "{err}");
}

#[test]
fn missing_dir_lists_empty_and_temp_files_are_cleaned() {
    let dir = tempfile::tempdir().unwrap();
    assert!(list_specs(&dir.path().join("nope")).unwrap().is_empty());
    fs::write(dir.path().join(temp_file_name(UID)), b"partial").unwrap();
    assert!(list_specs(dir.path()).unwrap().is_empty());
    assert_eq!(remove_temp_files(dir.path()).unwrap(), 1);
    assert!(dir_file_names(dir.path()).unwrap().is_empty());
}

#[test]
fn driver_mounts_go_into_the_spec_level_edits_of_every_spec() {
    let mounts = vec![Mount {
        host_path: "/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05".into(),
        container_path: "/usr/local/nvidia/lib64/libcuda.so.1".into(),
        options: vec!["ro".into(), "nosuid".into(), "nodev".into(), "bind".into()],
        mount_type: None,
    }];
    let mut a = build_claim_spec(UID, &[one("gpu", 0, 1, 0)]).unwrap().spec;
    let mut b = build_claim_spec(
        "1f2c1a7e-0b1d-4c55-9a0e-3d2f6b7c8d9e",
        &[one("gpu", 0, 2, 0)],
    )
    .unwrap()
    .spec;
    add_spec_mounts(&mut a, &mounts);
    add_spec_mounts(&mut b, &mounts);
    for s in [&a, &b] {
        assert_eq!(s.container_edits.as_ref().unwrap().mounts, mounts);
        assert!(
            s.devices
                .iter()
                .all(|d| d.container_edits.mounts.is_empty())
        );
        s.validate().unwrap();
    }
    let json = serde_json::to_value(&a).unwrap();
    assert_eq!(
        json["containerEdits"]["mounts"][0],
        json!({"hostPath": "/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05",
            "containerPath": "/usr/local/nvidia/lib64/libcuda.so.1",
            "options": ["ro", "nosuid", "nodev", "bind"]})
    );
    let before = a.clone();
    add_spec_mounts(&mut a, &[]);
    assert_eq!(a, before, "no driver root: the spec is unchanged");
}

/// A device's hooks (the GPU memory limit's `createRuntime` hook) go into its own edits, as CDI
/// writes them, and raise no `cdiVersion` (hooks exist since CDI 0.3.0).
#[test]
fn a_devices_hooks_go_into_its_edits_and_raise_no_cdi_version() {
    let hook = crate::claims::memory_limits::hook::memory_limit_hook(
        std::path::Path::new("/var/lib/kubelet/plugins/mig.das.com/bin/das-kubelet-plugin"),
        "GPU-00000003-aaaa-bbbb-cccc-dddddddddddd",
        "0000:03:00.0",
        8 << 30,
        std::path::Path::new("/sys/fs/cgroup"),
        &crate::claims::memory_limits::SetWith::Emulated,
    )
    .unwrap();
    let with_hook = SpecDevice {
        hooks: vec![hook],
        ..whole("gpu", 0, 3)
    };
    let built = build_claim_spec(UID, &[with_hook, one("gpu", 1, 1, 0)]).unwrap();
    let without = build_claim_spec(UID, &[whole("gpu", 0, 3), one("gpu", 1, 1, 0)]).unwrap();
    let value = serde_json::to_value(&built.spec).unwrap();
    let hooks = &value["devices"][0]["containerEdits"]["hooks"];
    assert_eq!(hooks[0]["hookName"], "createRuntime");
    assert_eq!(
        hooks[0]["path"],
        "/var/lib/kubelet/plugins/mig.das.com/bin/das-kubelet-plugin"
    );
    assert_eq!(hooks[0]["args"][1], "cdi-hook");
    assert_eq!(hooks[0]["timeout"], 60);
    assert!(value["devices"][1]["containerEdits"].get("hooks").is_none());
    assert_eq!(built.spec.cdi_version, without.spec.cdi_version);
    built.spec.validate().unwrap();
    let mut hooks_only = built.spec.clone();
    hooks_only.devices.truncate(1);
    hooks_only.devices[0].name = "gpu-3".into();
    hooks_only.devices[0].container_edits.device_nodes.clear();
    hooks_only.container_edits = None;
    assert_eq!(hooks_only.minimum_version(), "0.3.0");
    // What it reads back as.
    let back: Spec = serde_json::from_value(value).unwrap();
    assert_eq!(back, built.spec);
}
