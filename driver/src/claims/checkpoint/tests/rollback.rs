//! Rollback safety (issue 41): each save is written in the oldest version that holds its
//! content ([`Checkpoint::format_version`]), so the previous release's binary, run again by a
//! `helm rollback` of a failed upgrade, reads the file instead of moving it aside as corrupt and
//! rebuilding from the API server (which loses releasing records, pods, MIG mode switches and
//! the guards of claims whose containers still run).
//!
//! [`previous_release`] is the decoder of the release before version 9 (checkpoint version 8,
//! as `driver/src/claims/checkpoint/format.rs` had it at commit 207d7d0), kept frozen as a
//! fixture: what that binary accepts, and nothing more (`deny_unknown_fields` everywhere, the
//! versions it knew, the checksum over the same canonical serialization).

use super::*;

/// The previous release's checkpoint decoder (version 8), frozen.
mod previous_release {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Serialize};

    pub const CHECKPOINT_VERSION: u64 = 8;

    #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
    pub enum PrepareState {
        PrepareStarted,
        PrepareCompleted,
        Releasing,
        Carved,
    }

    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    pub struct InstanceId {
        pub gi_id: u32,
        pub ci_id: u32,
        #[serde(rename = "migUUID")]
        pub mig_uuid: String,
    }

    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    pub struct MpsLimits {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub active_thread_percentage: Option<u8>,
        #[serde(
            default,
            rename = "pinnedDeviceMemoryLimitMiB",
            skip_serializing_if = "Option::is_none"
        )]
        pub pinned_device_memory_limit_mib: Option<u64>,
    }

    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    pub struct Share {
        #[serde(rename = "shareID")]
        pub id: String,
        pub shares: u64,
        pub of: u64,
        pub memory_bytes: u64,
    }

    /// `kind`: `"gpu"` or `"mig"` (the default, left out).
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
    pub enum Kind {
        #[default]
        #[serde(rename = "mig")]
        Mig,
        #[serde(rename = "gpu")]
        Gpu,
    }

    fn is_mig(k: &Kind) -> bool {
        *k == Kind::Mig
    }

    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    pub struct RecordedDevice {
        #[serde(default, skip_serializing_if = "is_mig")]
        pub kind: Kind,
        pub request: String,
        pub pool: String,
        pub device: String,
        pub gpu_index: u32,
        #[serde(rename = "gpuUUID")]
        pub gpu_uuid: String,
        pub profile: String,
        pub placement_start: u32,
        pub placement_size: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub instance: Option<InstanceId>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub mps: Option<MpsLimits>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub share: Option<Share>,
    }

    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    pub struct ClaimRecord {
        pub namespace: String,
        pub name: String,
        pub state: PrepareState,
        pub devices: Vec<RecordedDevice>,
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        pub cdi_device_ids: BTreeMap<String, Vec<String>>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pub pods: Vec<String>,
        pub updated_at: u64,
    }

    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    pub struct MigModeSwitch {
        #[serde(rename = "gpuUUID")]
        pub gpu_uuid: String,
        pub mig_enabled: bool,
        pub claim: String,
        pub started_at: u64,
    }

    #[derive(Debug, Clone, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    pub(crate) struct Document {
        pub version: u64,
        pub boot_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub checksum: Option<String>,
        pub claims: BTreeMap<String, ClaimRecord>,
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        pub mig_mode_switches: BTreeMap<u32, MigModeSwitch>,
    }

    /// What the previous release's `parse` did with file content (version 1 left out: this
    /// binary never writes it): the document, or why it would have moved the file aside.
    pub fn parse(bytes: &[u8]) -> Result<Document, String> {
        let value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| format!("invalid JSON: {e}"))?;
        match value.get("version").and_then(serde_json::Value::as_u64) {
            Some(2..=7 | CHECKPOINT_VERSION) => {}
            other => return Err(format!("unknown version {other:?}")),
        }
        let doc: Document = serde_json::from_value(value).map_err(|e| format!("bad shape: {e}"))?;
        let mut unsummed = doc.clone();
        unsummed.checksum = None;
        let bytes = serde_json::to_vec(&unsummed).map_err(|e| e.to_string())?;
        let computed = format!("crc32:{:08x}", crc32fast::hash(&bytes));
        if doc.checksum.as_deref() != Some(computed.as_str()) {
            return Err(format!(
                "checksum mismatch: {:?} vs {computed}",
                doc.checksum
            ));
        }
        Ok(doc)
    }
}

fn instance(gi_id: u32) -> InstanceId {
    InstanceId {
        gi_id,
        ci_id: 0,
        mig_uuid: format!("MIG-{gi_id:08x}-aaaa-bbbb-cccc-dddddddddddd"),
    }
}

fn done(request: &str, start: u32, gi_id: u32) -> RecordedDevice {
    RecordedDevice {
        instance: Some(instance(gi_id)),
        ..device(request, start)
    }
}

/// Checkpoints with each feature a release added, in the order versions added them, and the
/// version each must be written as.
fn contents() -> Vec<(&'static str, Checkpoint, u64)> {
    let mut out = Vec::new();
    let mut cp = Checkpoint::new(BOOT);
    cp.set_completed(
        "uid-1",
        "ns",
        "c1",
        vec![done("gpu", 4, 5)],
        BTreeMap::new(),
    );
    cp.set_started("uid-2", "ns", "c2", vec![device("gpu", 6)]);
    cp.set_releasing("uid-3", "ns", "c3", vec![done("gpu", 2, 3)]);
    out.push(("records without pods", cp.clone(), 2));
    cp.set_pods("uid-1", vec!["pod-a".into()]);
    out.push(("pods", cp.clone(), 3));
    let whole = RecordedDevice {
        kind: DeviceKind::WholeGpu,
        device: "gpu-1".into(),
        gpu_index: 1,
        profile: "gpu".into(),
        placement_start: 0,
        placement_size: 8,
        ..device("whole", 0)
    };
    cp.set_completed("uid-4", "ns", "c4", vec![whole], BTreeMap::new());
    out.push(("a whole GPU", cp.clone(), 4));
    cp.set_mig_mode_switch(1, "GPU-1", false, "uid-4");
    out.push(("a MIG mode switch", cp.clone(), 5));
    let mps = RecordedDevice {
        mps: Some(crate::mps::MpsLimits {
            active_thread_percentage: Some(50),
            pinned_device_memory_limit_mib: Some(2048),
        }),
        ..done("mps", 0, 7)
    };
    cp.set_completed("uid-5", "ns", "c5", vec![mps.clone()], BTreeMap::new());
    out.push(("an MPS device", cp.clone(), 6));
    let share = RecordedDevice {
        share: Some(Share {
            id: "0f0e0d0c-0000-4000-8000-000000000001".into(),
            shares: 1,
            of: 4,
            memory_bytes: 2 << 30,
        }),
        ..mps
    };
    cp.set_completed("uid-6", "ns", "c6", vec![share], BTreeMap::new());
    out.push(("a share", cp.clone(), 7));
    cp.set_carved("uid-7", "ns", "c7", vec![done("gpu", 1, 9)]);
    out.push(("a carved claim", cp.clone(), 8));
    // A repair of a completed claim under way: the guard is stored (version 9).
    let mut repair = cp.clone();
    repair.set_started("uid-1", "ns", "c1", vec![device("gpu", 4)]);
    out.push(("a repair under way", repair, 9));
    let mut guard = cp.clone();
    guard.set_repairing("uid-1", "ns", "c1", vec![done("gpu", 4, 5)]);
    out.push(("a guard without instances", guard, 9));
    // A whole GPU time-sliced for its claim (version 10).
    let mut sliced = cp.clone();
    let whole = RecordedDevice {
        kind: DeviceKind::WholeGpu,
        device: "gpu-2".into(),
        gpu_index: 2,
        profile: "gpu".into(),
        placement_start: 0,
        placement_size: 8,
        time_slice: Some(das_api::device_config::TimeSliceInterval::Short),
        acquired: false,
        ..device("sliced", 0)
    };
    sliced.set_completed("uid-8", "ns", "c8", vec![whole], BTreeMap::new());
    out.push(("a time-sliced whole GPU", sliced, 10));
    // A share of a whole GPU, held (version 11).
    let mut whole_share = cp.clone();
    let held = RecordedDevice {
        kind: DeviceKind::WholeGpu,
        device: "gpu-2-shared".into(),
        gpu_index: 2,
        profile: "gpu".into(),
        placement_start: 0,
        placement_size: 8,
        share: Some(Share {
            id: "share-9".into(),
            shares: 1,
            of: 4,
            memory_bytes: 4 << 30,
        }),
        acquired: true,
        ..device("whole-share", 0)
    };
    whole_share.set_completed("uid-9", "ns", "c9", vec![held], BTreeMap::new());
    out.push(("a share of a whole GPU", whole_share, 11));
    out
}

/// Every content is written as the oldest version that holds it, and reads back the same.
#[test]
fn each_save_is_written_in_the_oldest_version_that_holds_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(CHECKPOINT_FILE_NAME);
    for (what, cp, version) in contents() {
        assert_eq!(cp.format_version(), version, "{what}");
        cp.save(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.contains(&format!("\"version\": {version},")),
            "{what}: {text}"
        );
        assert_eq!(
            Checkpoint::load(&path, BOOT).unwrap(),
            LoadOutcome::Loaded(cp),
            "{what}"
        );
    }
}

/// The previous release reads every file this one writes that holds nothing newer than its
/// version 8, with the same records; a file with a repair's guard (version 9) it moves aside
/// as corrupt (an unknown version), which is the only case a rollback loses the checkpoint.
#[test]
fn the_previous_release_reads_what_this_one_writes() {
    for (what, cp, version) in contents() {
        let bytes = cp.to_bytes().unwrap();
        let old = previous_release::parse(&bytes);
        if version > previous_release::CHECKPOINT_VERSION {
            let err = old.expect_err(what);
            assert!(err.contains("unknown version"), "{what}: {err}");
            continue;
        }
        let doc = old.unwrap_or_else(|e| panic!("{what}: the previous release refuses it: {e}"));
        // Same records, field by field: both sides as JSON, without version and checksum.
        let ours: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        let theirs = serde_json::to_value(&doc).unwrap();
        for key in ["bootId", "claims", "migModeSwitches"] {
            assert_eq!(ours.get(key), theirs.get(key), "{what}: {key}");
        }
        assert_eq!(doc.claims.len(), cp.claims.len(), "{what}");
    }
}

/// A release for good ends a guard: the record is no longer handed, so it is dropped once its
/// instances are gone and its file is the previous release's version again.
#[test]
fn a_release_for_good_ends_the_guard() {
    let mut cp = Checkpoint::new(BOOT);
    cp.set_completed(
        "uid-1",
        "ns",
        "c1",
        vec![done("gpu", 4, 5)],
        BTreeMap::new(),
    );
    cp.set_releasing("uid-1", "ns", "c1", vec![done("gpu", 4, 5)]);
    let r = cp.get("uid-1").unwrap();
    assert!(r.is_handed() && r.handed_to_kubelet);
    assert_eq!(cp.format_version(), 9);
    cp.set_releasing_for_good("uid-1", "ns", "c1", vec![done("gpu", 4, 5)]);
    let r = cp.get("uid-1").unwrap();
    assert!(!r.is_handed());
    assert_eq!(cp.format_version(), 2);
}

/// A guard being released keeps every device it had: those left to destroy with their
/// instance, the others without one, so all its placements stay held.
#[test]
fn a_guard_being_released_keeps_all_its_placements() {
    let mut cp = Checkpoint::new(BOOT);
    let both = vec![done("a", 0, 1), done("b", 4, 2)];
    cp.set_completed("uid-1", "ns", "c1", both, BTreeMap::new());
    // Only device b's destroy failed.
    cp.set_releasing("uid-1", "ns", "c1", vec![done("b", 4, 2)]);
    let r = cp.get("uid-1").unwrap();
    assert_eq!(r.devices.len(), 2);
    assert_eq!(r.devices[0].instance, None);
    assert_eq!(r.devices[1].instance, Some(instance(2)));
    // A record the kubelet never held keeps only what is left.
    cp.set_started("uid-2", "ns", "c2", vec![device("a", 0), device("b", 4)]);
    cp.set_releasing("uid-2", "ns", "c2", vec![done("b", 4, 2)]);
    assert_eq!(cp.get("uid-2").unwrap().devices.len(), 1);
    // Then its guard without instances: every device, none with an instance.
    cp.set_repairing(
        "uid-1",
        "ns",
        "c1",
        cp.get("uid-1").unwrap().devices.clone(),
    );
    let r = cp.get("uid-1").unwrap();
    assert_eq!(r.state, PrepareState::Repairing);
    assert!(r.is_handed() && !r.handed_to_kubelet);
    assert!(r.devices.iter().all(|d| d.instance.is_none()));
    assert_eq!(r.devices.len(), 2);
}
