//! The checkpoint's version 8: the state `Carved` (carve before bind, issue 34), and the
//! upgrade of version 7.

use std::fs;

use super::*;

/// A carved record keeps its state and instances through a save and a load.
#[test]
fn a_carved_record_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(CHECKPOINT_FILE_NAME);
    let mut cp = sample();
    cp.set_carved("uid-c", "ns", "carved", vec![device("gpu", 0)]);
    cp.save(&path).unwrap();
    assert_eq!(
        Checkpoint::load(&path, BOOT).unwrap(),
        LoadOutcome::Loaded(cp.clone())
    );
    let text = fs::read_to_string(&path).unwrap();
    assert!(text.contains("\"state\": \"Carved\""), "{text}");
    // The oldest version with the state `Carved`.
    assert!(text.contains("\"version\": 8"), "{text}");
    let r = cp.get("uid-c").unwrap();
    assert_eq!(r.state, PrepareState::Carved);
    assert!(r.cdi_device_ids.is_empty());
}

/// A version-7 file (no carved record) is read as it was, and saved as version 8.
#[test]
fn a_version_7_file_is_upgraded_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(CHECKPOINT_FILE_NAME);
    let v7 = sample();
    let mut doc = older_document(7, &v7);
    doc.mig_mode_switches = v7.mig_mode_switches.clone();
    doc.checksum = None;
    doc.checksum = Some(doc.compute_checksum().unwrap());
    fs::write(&path, serde_json::to_string_pretty(&doc).unwrap()).unwrap();
    // Versions 2 to 9 are one document: an older one loads as it is.
    let LoadOutcome::Loaded(checkpoint) = Checkpoint::load(&path, BOOT).unwrap() else {
        panic!("expected the version-7 file to load");
    };
    assert_eq!(checkpoint, v7);
}
