//! Unit tests of [`super`] (`device_nodes.rs`).

use super::*;

#[test]
fn every_gi_and_ci_of_every_gpu_gets_a_caps_node() {
    let nodes = stand_in_nodes(&[0, 1], 509);
    // 3 shared + per GPU: its node and 15 GIs × (1 + 8 CIs).
    assert_eq!(nodes.len(), 3 + 2 * (1 + 15 * 9));
    assert!(nodes.contains(&StandInNode {
        relative: "nvidia1".into(),
        major: 195,
        minor: 1
    }));
    let gi = gi_cap_minor(1, 14);
    assert!(nodes.contains(&StandInNode {
        relative: format!("nvidia-caps/nvidia-cap{gi}"),
        major: 509,
        minor: gi
    }));
    let mut minors: Vec<u32> = nodes
        .iter()
        .filter(|n| n.major == 509)
        .map(|n| n.minor)
        .collect();
    let count = minors.len();
    minors.sort();
    minors.dedup();
    assert_eq!(minors.len(), count, "no two caps nodes share a minor");
}

#[test]
fn nodes_are_created_once_and_mended() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = stand_in_nodes(&[0], 509);
    match create_stand_in_nodes(dir.path(), &nodes) {
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            assert!(e.to_string().contains("CAP_MKNOD"), "{e}");
            return; // not root: the message is what a user gets
        }
        r => r.unwrap(),
    }
    assert!(has_numbers(&dir.path().join("nvidia0"), 195, 0));
    assert!(has_numbers(&dir.path().join("nvidiactl"), 195, 255));
    // A node with wrong numbers is replaced; a plain file too.
    std::fs::remove_file(dir.path().join("nvidia0")).unwrap();
    std::fs::write(dir.path().join("nvidia0"), b"not a device").unwrap();
    create_stand_in_nodes(dir.path(), &nodes).unwrap();
    assert!(has_numbers(&dir.path().join("nvidia0"), 195, 0));
}
