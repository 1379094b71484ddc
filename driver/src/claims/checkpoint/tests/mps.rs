//! The checkpoint's versions 6 and 7: a device's MPS limits (docs/design.md §7, "MPS on a
//! slice") and a share of a shareable device ("Shared slices"), and the upgrades of versions 5
//! and 6.

use std::fs;

use super::*;

/// An MPS device (docs/design.md §7, "MPS on a slice") keeps its limits through a save and a
/// load; an exclusive device is written without `mps`, as in version 5.
#[test]
fn an_mps_device_round_trips_with_its_limits() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(CHECKPOINT_FILE_NAME);
    let mut cp = sample();
    let mut shared = device("gpu", 0);
    shared.mps = Some(crate::mps::MpsLimits {
        active_thread_percentage: Some(50),
        pinned_device_memory_limit_mib: Some(2048),
    });
    cp.set_started("uid-4", "ns", "claim-4", vec![shared]);
    cp.save(&path).unwrap();
    assert_eq!(
        Checkpoint::load(&path, BOOT).unwrap(),
        LoadOutcome::Loaded(cp.clone())
    );
    let text = fs::read_to_string(&path).unwrap();
    assert_eq!(text.matches("\"mps\"").count(), 1, "{text}");
    assert!(
        text.contains("\"activeThreadPercentage\": 50")
            && text.contains("\"pinnedDeviceMemoryLimitMiB\": 2048"),
        "{text}"
    );
}

/// A version-5 file (no device has `mps`) is read with every device exclusive, and saved as
/// the oldest version that holds it (records with pods, nothing newer: version 3).
#[test]
fn a_version_5_file_is_upgraded_with_every_device_exclusive() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(CHECKPOINT_FILE_NAME);
    let v5 = sample();
    let mut doc = older_document(5, &v5);
    doc.mig_mode_switches = v5.mig_mode_switches.clone();
    doc.checksum = None;
    doc.checksum = Some(doc.compute_checksum().unwrap());
    fs::write(&path, serde_json::to_string_pretty(&doc).unwrap()).unwrap();
    // Versions 2 to 9 are one document: an older one loads as it is.
    let LoadOutcome::Loaded(checkpoint) = Checkpoint::load(&path, BOOT).unwrap() else {
        panic!("expected the version-5 file to load");
    };
    assert_eq!(checkpoint, v5);
    assert!(
        checkpoint
            .claims
            .values()
            .flat_map(|r| &r.devices)
            .all(|d| d.mps.is_none())
    );
    checkpoint.save(&path).unwrap();
    let version = checkpoint.format_version();
    assert_eq!(version, 3);
    assert!(
        fs::read_to_string(&path)
            .unwrap()
            .contains(&format!("\"version\": {version},"))
    );
}

/// A share of a shareable device (version 7; docs/design.md §7, "Shared slices") keeps its
/// share through a save and a load; a version-6 file (no `share`) is read with every device
/// held alone.
#[test]
fn a_share_round_trips_and_a_version_6_file_has_none() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(CHECKPOINT_FILE_NAME);
    let mut cp = sample();
    let mut share = device("s", 2);
    share.device = "gpu-0-mig-1g-10gb-2-shared".into();
    share.mps = Some(crate::mps::MpsLimits::default());
    share.share = Some(crate::claims::checkpoint::Share {
        id: "5f0c2a1e-0000-4000-8000-000000000001".into(),
        shares: 2,
        of: 4,
        memory_bytes: 2 << 30,
    });
    cp.set_started("uid-5", "ns", "claim-5", vec![share]);
    cp.save(&path).unwrap();
    assert_eq!(
        Checkpoint::load(&path, BOOT).unwrap(),
        LoadOutcome::Loaded(cp.clone())
    );
    let text = fs::read_to_string(&path).unwrap();
    assert!(
        text.contains("\"shareID\": \"5f0c2a1e-0000-4000-8000-000000000001\"")
            && text.contains("\"memoryBytes\": 2147483648"),
        "{text}"
    );
    assert_eq!(text.matches("\"share\"").count(), 1, "{text}");

    let v6 = sample();
    let mut doc = older_document(6, &v6);
    doc.mig_mode_switches = v6.mig_mode_switches.clone();
    doc.checksum = None;
    doc.checksum = Some(doc.compute_checksum().unwrap());
    fs::write(&path, serde_json::to_string_pretty(&doc).unwrap()).unwrap();
    assert_eq!(
        Checkpoint::load(&path, BOOT).unwrap(),
        LoadOutcome::Loaded(v6)
    );
}
