//! Unit tests of [`super`] (`checkpoint/`): the document and its file.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use super::format::{Document, v1};
use super::*;

mod carved;
mod mps;
mod observe;
mod rollback;

const BOOT: &str = "3f1b2c4d-1111-2222-3333-444455556666";

fn device(request: &str, start: u32) -> RecordedDevice {
    RecordedDevice {
        time_slice: None,
        acquired: false,
        kind: DeviceKind::Mig,
        request: request.to_string(),
        pool: "node-a".into(),
        device: format!("gpu-0-mig-1g-10gb-{start}"),
        gpu_index: 0,
        gpu_uuid: "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee".into(),
        profile: "1g.10gb".into(),
        placement_start: start,
        placement_size: 2,
        instance: None,
        mps: None,
        share: None,
    }
}

fn sample() -> Checkpoint {
    let mut cp = Checkpoint::new(BOOT);
    cp.set_started("uid-1", "ns", "claim-1", vec![device("gpu", 6)]);
    let mut done = device("gpu", 4);
    done.instance = Some(InstanceId {
        gi_id: 5,
        ci_id: 0,
        mig_uuid: "MIG-12345678-aaaa-bbbb-cccc-dddddddddddd".into(),
    });
    let ids = BTreeMap::from([(
        "gpu-0-mig-1g-10gb-4".to_string(),
        vec!["das.com/mig=uid-2-gpu-0-mig-1g-10gb-4".to_string()],
    )]);
    cp.set_completed("uid-2", "ns", "claim-2", vec![done.clone()], ids);
    assert!(cp.set_pods("uid-2", vec!["pod-a".into(), "pod-b".into()]));
    let mut leftover = device("gpu", 2);
    leftover.instance = Some(InstanceId {
        gi_id: 3,
        ci_id: 0,
        mig_uuid: "MIG-22222222-aaaa-bbbb-cccc-dddddddddddd".into(),
    });
    cp.set_releasing("uid-3", "ns", "claim-3", vec![leftover]);
    cp
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

fn saved(dir: &Path) -> PathBuf {
    let path = dir.join(CHECKPOINT_FILE_NAME);
    sample().save(&path).unwrap();
    path
}

fn expect_corrupt(path: &Path) -> CorruptReason {
    match Checkpoint::load(path, BOOT).unwrap() {
        LoadOutcome::Corrupt { moved_to, reason } => {
            assert!(!path.exists(), "corrupt file left in place");
            assert!(moved_to.exists());
            let name = moved_to.file_name().unwrap().to_str().unwrap();
            assert!(name.starts_with("checkpoint.json.corrupt-"), "{name}");
            // The next load starts fresh instead of failing again.
            assert_eq!(Checkpoint::load(path, BOOT).unwrap(), LoadOutcome::Fresh);
            reason
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

#[test]
fn round_trip_keeps_every_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = saved(dir.path());
    let cp = sample();
    assert_eq!(
        Checkpoint::load(&path, BOOT).unwrap(),
        LoadOutcome::Loaded(cp.clone())
    );
    let record = cp.get("uid-2").unwrap();
    assert_eq!(record.state, PrepareState::PrepareCompleted);
    assert_eq!(cp.get("uid-1").unwrap().state, PrepareState::PrepareStarted);
    // The documented JSON names.
    let text = fs::read_to_string(&path).unwrap();
    assert_eq!(cp.get("uid-3").unwrap().state, PrepareState::Releasing);
    for key in [
        // The oldest version that holds it: records with pods, nothing newer.
        "\"version\": 3",
        "\"pods\"",
        "\"instance\"",
        "\"giId\"",
        "\"Releasing\"",
        "\"bootId\"",
        "\"checksum\": \"crc32:",
        "\"gpuUUID\"",
        "\"migUUID\"",
        "\"placementStart\"",
        "\"cdiDeviceIds\"",
        "\"updatedAt\"",
        "\"PrepareStarted\"",
    ] {
        assert!(text.contains(key), "{key} missing in {text}");
    }
}

#[test]
fn save_leaves_no_temp_file_and_replaces_old_content() {
    let dir = tempfile::tempdir().unwrap();
    let path = saved(dir.path());
    let mut cp = sample();
    cp.remove("uid-1");
    cp.save(&path).unwrap();
    assert_eq!(names_in(dir.path()), vec![CHECKPOINT_FILE_NAME.to_string()]);
    assert_eq!(
        Checkpoint::load(&path, BOOT).unwrap(),
        LoadOutcome::Loaded(cp)
    );
}

#[test]
fn save_creates_the_state_dir() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state/plugin").join(CHECKPOINT_FILE_NAME);
    Checkpoint::new(BOOT).save(&path).unwrap();
    assert!(matches!(
        Checkpoint::load(&path, BOOT).unwrap(),
        LoadOutcome::Loaded(_)
    ));
}

#[test]
fn missing_file_is_fresh() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(CHECKPOINT_FILE_NAME);
    assert_eq!(Checkpoint::load(&path, BOOT).unwrap(), LoadOutcome::Fresh);
}

#[test]
fn new_boot_id_reports_previous_and_keeps_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = saved(dir.path());
    let outcome = Checkpoint::load(&path, "another-boot").unwrap();
    assert_eq!(outcome, LoadOutcome::NewBoot { previous: sample() });
    assert!(path.exists());
}

#[test]
fn corrupt_json_is_moved_aside() {
    let dir = tempfile::tempdir().unwrap();
    let path = saved(dir.path());
    let text = fs::read_to_string(&path).unwrap();
    fs::write(&path, &text[..text.len() / 2]).unwrap();
    assert!(matches!(
        expect_corrupt(&path),
        CorruptReason::InvalidJson(_)
    ));
}

#[test]
fn checksum_mismatch_is_moved_aside() {
    let dir = tempfile::tempdir().unwrap();
    let path = saved(dir.path());
    let text = fs::read_to_string(&path).unwrap();
    fs::write(&path, text.replace("claim-1", "claim-9")).unwrap();
    let reason = expect_corrupt(&path);
    assert!(
        matches!(reason, CorruptReason::ChecksumMismatch { .. }),
        "{reason}"
    );
}

#[test]
fn unknown_version_is_moved_aside() {
    let dir = tempfile::tempdir().unwrap();
    let path = saved(dir.path());
    let text = fs::read_to_string(&path).unwrap();
    let next = CHECKPOINT_VERSION + 1;
    fs::write(
        &path,
        text.replace("\"version\": 3", &format!("\"version\": {next}")),
    )
    .unwrap();
    assert_eq!(
        expect_corrupt(&path),
        CorruptReason::UnknownVersion(next.to_string())
    );
}

/// A whole GPU's device: profile `gpu`, every memory slice, no instance.
fn whole_gpu(request: &str) -> RecordedDevice {
    RecordedDevice {
        time_slice: None,
        acquired: false,
        kind: DeviceKind::WholeGpu,
        request: request.to_string(),
        pool: "node-a".into(),
        device: "gpu-1".into(),
        gpu_index: 1,
        gpu_uuid: "GPU-11111111-bbbb-cccc-dddd-eeeeeeeeeeee".into(),
        profile: das_api::WHOLE_GPU_PROFILE.into(),
        placement_start: 0,
        placement_size: 8,
        instance: None,
        mps: None,
        share: None,
    }
}

/// Version 4: a whole GPU's device is written with `"kind": "gpu"` and reads back as one; a MIG
/// device is written without `kind`, as in version 3.
#[test]
fn a_whole_gpu_device_round_trips_with_its_kind() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(CHECKPOINT_FILE_NAME);
    let mut cp = sample();
    let mut mig = device("slice", 6);
    mig.instance = Some(InstanceId {
        gi_id: 9,
        ci_id: 0,
        mig_uuid: "MIG-33333333-aaaa-bbbb-cccc-dddddddddddd".into(),
    });
    cp.set_completed(
        "uid-4",
        "ns",
        "claim-4",
        vec![whole_gpu("whole"), mig],
        BTreeMap::new(),
    );
    cp.save(&path).unwrap();
    assert_eq!(
        Checkpoint::load(&path, BOOT).unwrap(),
        LoadOutcome::Loaded(cp.clone())
    );
    let text = fs::read_to_string(&path).unwrap();
    assert_eq!(text.matches("\"kind\"").count(), 1, "{text}");
    assert!(text.contains("\"kind\": \"gpu\""), "{text}");
    let devices = &cp.get("uid-4").unwrap().devices;
    assert!(devices[0].is_whole_gpu() && !devices[1].is_whole_gpu());
    // An unknown kind is not guessed at.
    fs::write(
        &path,
        text.replace("\"kind\": \"gpu\"", "\"kind\": \"vgpu\""),
    )
    .unwrap();
    let CorruptReason::BadShape(e) = expect_corrupt(&path) else {
        panic!("expected a bad shape");
    };
    assert!(e.contains("vgpu"), "{e}");
}

/// A file written by version 3 (before whole GPUs), as its binary wrote it: no `kind`.
const V3_FILE: &str = r#"{
  "version": 3,
  "bootId": "3f1b2c4d-1111-2222-3333-444455556666",
  "checksum": "CHECKSUM",
  "claims": {
    "uid-2": {
      "namespace": "ns",
      "name": "claim-2",
      "state": "PrepareCompleted",
      "devices": [
        {
          "request": "gpu",
          "pool": "node-a",
          "device": "gpu-0-mig-1g-10gb-4",
          "gpuIndex": 0,
          "gpuUUID": "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
          "profile": "1g.10gb",
          "placementStart": 4,
          "placementSize": 2,
          "instance": {
            "giId": 5,
            "ciId": 0,
            "migUUID": "MIG-12345678-aaaa-bbbb-cccc-dddddddddddd"
          }
        }
      ],
      "cdiDeviceIds": {
        "gpu-0-mig-1g-10gb-4": [
          "das.com/mig=uid-2-gpu-0-mig-1g-10gb-4"
        ]
      },
      "pods": [
        "pod-a"
      ],
      "updatedAt": 1767225600
    }
  }
}
"#;

/// A version-3 file is read with every device a MIG device, never moved aside; saved again, it
/// is a version-3 file still (nothing in it needs a newer one) that loads as such.
#[test]
fn a_version_3_file_is_upgraded_with_every_device_a_mig_device() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(CHECKPOINT_FILE_NAME);
    let doc: Document = serde_json::from_str(V3_FILE).unwrap();
    fs::write(
        &path,
        V3_FILE.replace("CHECKSUM", &doc.compute_checksum().unwrap()),
    )
    .unwrap();
    // Versions 2 to 9 are one document: an older one loads as it is.
    let LoadOutcome::Loaded(checkpoint) = Checkpoint::load(&path, BOOT).unwrap() else {
        panic!("expected the version-3 file to load");
    };
    let record = checkpoint.get("uid-2").unwrap();
    assert_eq!(record.state, PrepareState::PrepareCompleted);
    assert_eq!(record.pods, ["pod-a"]);
    assert_eq!(record.devices[0].kind, DeviceKind::Mig);
    assert_eq!(
        record.devices[0].mig_uuid(),
        Some("MIG-12345678-aaaa-bbbb-cccc-dddddddddddd")
    );
    checkpoint.save(&path).unwrap();
    let text = fs::read_to_string(&path).unwrap();
    assert!(
        text.contains("\"version\": 3") && !text.contains("\"kind\""),
        "{text}"
    );
    assert_eq!(
        Checkpoint::load(&path, BOOT).unwrap(),
        LoadOutcome::Loaded(checkpoint)
    );
}

/// A version-2 file (no `pods`) is read as version 3 with no pods known; its pods survive a
/// release of the claim (the record keeps them across states).
#[test]
fn a_version_2_file_is_upgraded_with_no_pods_known() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(CHECKPOINT_FILE_NAME);
    let mut v2 = sample();
    v2.set_pods("uid-2", Vec::new());
    let doc = older_document(2, &v2);
    let text = serde_json::to_string_pretty(&doc).unwrap();
    assert!(!text.contains("pods"), "{text}");
    fs::write(&path, text).unwrap();
    let LoadOutcome::Loaded(mut checkpoint) = Checkpoint::load(&path, BOOT).unwrap() else {
        panic!("expected the version-2 file to load");
    };
    assert_eq!(checkpoint, v2);
    assert!(checkpoint.set_pods("uid-2", vec!["pod-a".into()]));
    assert!(
        !checkpoint.set_pods("uid-2", vec!["pod-a".into()]),
        "no change"
    );
    let devices = checkpoint.get("uid-2").unwrap().devices.clone();
    checkpoint.set_releasing("uid-2", "ns", "claim-2", devices);
    assert_eq!(checkpoint.get("uid-2").unwrap().pods, ["pod-a"]);
}

/// A file written by the first release (version 1), byte for byte as it wrote it.
const V1_FILE: &str = r#"{
  "version": 1,
  "bootId": "3f1b2c4d-1111-2222-3333-444455556666",
  "checksum": "CHECKSUM",
  "claims": {
"uid-1": {
  "namespace": "ns",
  "name": "claim-1",
  "state": "PrepareStarted",
  "devices": [
    {
      "request": "gpu",
      "pool": "node-a",
      "device": "gpu-0-mig-1g-10gb-6",
      "gpuIndex": 0,
      "gpuUUID": "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
      "profile": "1g.10gb",
      "placementStart": 6,
      "placementSize": 2
    }
  ],
  "updatedAt": 1767225600
},
"uid-2": {
  "namespace": "ns",
  "name": "claim-2",
  "state": "PrepareCompleted",
  "devices": [
    {
      "request": "gpu",
      "pool": "node-a",
      "device": "gpu-0-mig-1g-10gb-4",
      "gpuIndex": 0,
      "gpuUUID": "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
      "profile": "1g.10gb",
      "placementStart": 4,
      "placementSize": 2,
      "giId": 5,
      "ciId": 0,
      "migUUID": "MIG-12345678-aaaa-bbbb-cccc-dddddddddddd"
    }
  ],
  "cdiDeviceIds": {
    "gpu": [
      "das.com/mig=uid-2-gpu"
    ]
  },
  "updatedAt": 1767225600
}
  }
}
"#;

/// The version-1 file with its real checksum filled in.
fn v1_file() -> String {
    let doc: v1::Document = serde_json::from_str(V1_FILE).unwrap();
    V1_FILE.replace("CHECKSUM", &doc.compute_checksum().unwrap())
}

#[test]
fn a_version_1_file_is_upgraded_not_moved_aside() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(CHECKPOINT_FILE_NAME);
    fs::write(&path, v1_file()).unwrap();
    let LoadOutcome::Upgraded { checkpoint, from } = Checkpoint::load(&path, BOOT).unwrap() else {
        panic!("expected an upgrade")
    };
    assert_eq!(from, 1);
    let started = checkpoint.get("uid-1").unwrap();
    assert_eq!(started.state, PrepareState::PrepareStarted);
    assert_eq!(started.devices[0].instance, None);
    let done = checkpoint.get("uid-2").unwrap();
    assert_eq!(done.state, PrepareState::PrepareCompleted);
    assert_eq!(
        done.devices[0].instance,
        Some(InstanceId {
            gi_id: 5,
            ci_id: 0,
            mig_uuid: "MIG-12345678-aaaa-bbbb-cccc-dddddddddddd".into()
        })
    );
    assert_eq!(done.cdi_device_ids["gpu"], ["das.com/mig=uid-2-gpu"]);
    // Saved, it is a file of the oldest version that holds it (no pods: 2), which loads as
    // such and round-trips.
    checkpoint.save(&path).unwrap();
    assert!(
        fs::read_to_string(&path)
            .unwrap()
            .contains("\"version\": 2,")
    );
    assert_eq!(
        Checkpoint::load(&path, BOOT).unwrap(),
        LoadOutcome::Loaded(checkpoint)
    );
}

#[test]
fn a_version_1_file_with_a_bad_checksum_is_still_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(CHECKPOINT_FILE_NAME);
    fs::write(&path, v1_file().replace("claim-2", "claim-9")).unwrap();
    assert!(matches!(
        expect_corrupt(&path),
        CorruptReason::ChecksumMismatch { .. }
    ));
}

#[test]
fn unexpected_field_is_moved_aside() {
    let dir = tempfile::tempdir().unwrap();
    let path = saved(dir.path());
    let text = fs::read_to_string(&path).unwrap();
    fs::write(&path, text.replace("\"pool\"", "\"poolX\"")).unwrap();
    assert!(matches!(expect_corrupt(&path), CorruptReason::BadShape(_)));
}

#[test]
fn two_corrupt_files_get_distinct_names() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(CHECKPOINT_FILE_NAME);
    fs::write(&path, b"garbage").unwrap();
    expect_corrupt(&path);
    fs::write(&path, b"garbage").unwrap();
    expect_corrupt(&path);
    assert_eq!(names_in(dir.path()).len(), 2);
}

#[test]
fn remove_is_idempotent() {
    let mut cp = sample();
    assert!(cp.remove("uid-1").is_some());
    assert!(cp.remove("uid-1").is_none());
    assert!(cp.remove("never-seen").is_none());
    assert_eq!(cp.claims.len(), 2);
}

#[test]
fn boot_id_is_read_and_trimmed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("boot_id");
    fs::write(&path, format!("{BOOT}\n")).unwrap();
    assert_eq!(read_boot_id_from(&path).unwrap(), BOOT);
    fs::write(&path, "\n").unwrap();
    assert!(read_boot_id_from(&path).is_err());
    assert!(read_boot_id_from(&dir.path().join("none")).is_err());
}

/// A version-4 file (no `migModeSwitches`) is read as version 5 with no switch under way, and
/// saved as version 5.
#[test]
fn a_version_4_file_is_upgraded_with_no_switch_under_way() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(CHECKPOINT_FILE_NAME);
    let v4 = sample();
    let doc = older_document(4, &v4);
    fs::write(&path, serde_json::to_string_pretty(&doc).unwrap()).unwrap();
    // Versions 2 to 9 are one document: an older one loads as it is.
    let LoadOutcome::Loaded(checkpoint) = Checkpoint::load(&path, BOOT).unwrap() else {
        panic!("expected the version-4 file to load");
    };
    assert_eq!(checkpoint, v4);
    assert!(checkpoint.mig_mode_switches.is_empty());
}

/// `cp` as a file of an older `version` would hold it (no switches under way), checksummed.
fn older_document(version: u64, cp: &Checkpoint) -> Document {
    let mut doc = Document {
        version,
        boot_id: cp.boot_id.clone(),
        checksum: None,
        claims: cp.claims.clone(),
        mig_mode_switches: Default::default(),
    };
    doc.checksum = Some(doc.compute_checksum().unwrap());
    doc
}
