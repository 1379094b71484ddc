//! Unit tests of [`super`] (`carve.rs`): which claims are carved or released, and the status
//! bodies of carve before bind.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::*;
use crate::claims::checkpoint::{Checkpoint, InstanceId};
use crate::claims::claim_api::status_apply_body_with;
use crate::claims::testing::{MemoryApi, NODE};

fn now() -> Time {
    Time("2026-01-01T00:00:00Z".parse().unwrap())
}

fn device(name: &str) -> RecordedDevice {
    RecordedDevice {
        time_slice: None,
        acquired: false,
        kind: Default::default(),
        request: "gpu".into(),
        pool: NODE.into(),
        device: name.into(),
        gpu_index: 0,
        gpu_uuid: "GPU-0".into(),
        profile: "1g.10gb".into(),
        placement_start: 6,
        placement_size: 1,
        instance: Some(InstanceId {
            gi_id: 13,
            ci_id: 0,
            mig_uuid: "MIG-abc".into(),
        }),
        mps: None,
        share: None,
    }
}

/// A claim allocated `gpu-0-mig-1g-10gb-6` on [`NODE`], waiting for its carve or not.
fn claim(waits: bool) -> (MemoryApi, ClaimRef, ResourceClaim) {
    let api = MemoryApi::default();
    let c = api.allocate("ns", "c", "uid-c", &[("gpu", "gpu-0-mig-1g-10gb-6")]);
    if waits {
        api.wait_for_carve(&c);
    }
    let rc = api.claim(&c).unwrap();
    (api, c, rc)
}

fn record(state: PrepareState) -> ClaimRecord {
    let mut cp = Checkpoint::new("boot");
    cp.set_carved("uid-c", "ns", "c", vec![device("gpu-0-mig-1g-10gb-6")]);
    let mut r = cp.get("uid-c").unwrap().clone();
    r.state = state;
    r
}

#[test]
fn a_claim_that_waits_is_carved_once() {
    let (api, c, rc) = claim(true);
    assert!(waits_for_carve(&rc, NODE));
    assert!(!waits_for_carve(&rc, "another-node"));
    assert!(!carve_answered(&rc, NODE));
    assert_eq!(on_claim_seen(&rc, NODE, None), OnClaimSeen::Carve);
    // Answered (ready or failed): not carved again.
    for outcome in [CarveOutcome::Ready, CarveOutcome::Failed("no".into())] {
        let (api, c, _) = claim(true);
        api.carve_status(&c, &[device("gpu-0-mig-1g-10gb-6")], &outcome)
            .unwrap();
        let rc = api.claim(&c).unwrap();
        assert!(carve_answered(&rc, NODE));
        assert_eq!(on_claim_seen(&rc, NODE, None), OnClaimSeen::Nothing);
    }
    // Recorded already: prepared, nothing; carved but not answered (the status write was
    // lost), SliceReady written again ([`OnClaimSeen::Announce`]).
    assert_eq!(
        on_claim_seen(&rc, NODE, Some(&record(PrepareState::PrepareCompleted))),
        OnClaimSeen::Nothing
    );
    assert_eq!(
        on_claim_seen(&rc, NODE, Some(&record(PrepareState::Carved))),
        OnClaimSeen::Announce
    );
    drop((api, c));
}

#[test]
fn an_answer_left_by_an_earlier_allocation_is_no_answer() {
    let (api, c, _) = claim(true);
    api.carve_status(
        &c,
        &[device("gpu-0-mig-1g-10gb-6")],
        &CarveOutcome::Failed("no".into()),
    )
    .unwrap();
    // Allocated again after the failure (the scheduler's next try), the same device.
    api.change(&c, |rc| {
        let a = rc.status.as_mut().unwrap().allocation.as_mut().unwrap();
        a.allocation_timestamp = Some(Time("2999-01-01T00:00:00Z".parse().unwrap()));
    });
    let rc = api.claim(&c).unwrap();
    assert!(!carve_answered(&rc, NODE));
    assert_eq!(on_claim_seen(&rc, NODE, None), OnClaimSeen::Carve);
    // Another device: its entry is no answer either.
    let c = api.allocate("ns", "c", "uid-c", &[("gpu", "gpu-0-mig-1g-10gb-5")]);
    api.wait_for_carve(&c);
    api.change(&c, |rc| {
        let entries = serde_json::from_value(serde_json::json!([{"driver": "mig.das.com",
            "pool": NODE, "device": "gpu-0-mig-1g-10gb-6", "conditions": [{"type": SLICE_FAILED,
            "status": "True", "reason": "CarveFailed", "message": "no",
            "lastTransitionTime": "2026-01-01T00:00:00Z"}]}]))
        .unwrap();
        rc.status.as_mut().unwrap().devices = Some(entries);
    });
    assert!(!carve_answered(&api.claim(&c).unwrap(), NODE));
}

#[test]
fn a_claim_without_binding_conditions_or_being_deleted_is_not_carved() {
    let (_, _, rc) = claim(false);
    assert!(!waits_for_carve(&rc, NODE));
    assert_eq!(on_claim_seen(&rc, NODE, None), OnClaimSeen::Nothing);
    let (_, _, mut rc) = claim(true);
    rc.metadata.deletion_timestamp = Some(now());
    assert_eq!(on_claim_seen(&rc, NODE, None), OnClaimSeen::Nothing);
}

#[test]
fn a_carved_claim_no_longer_allocated_as_recorded_is_released() {
    let carved = record(PrepareState::Carved);
    let (api, c, rc) = claim(true);
    // Still allocated as recorded, but its status does not say SliceReady (a stop between the
    // carve and its status write): written again, or the scheduler would wait for its timeout.
    assert_eq!(
        on_claim_seen(&rc, NODE, Some(&carved)),
        OnClaimSeen::Announce
    );
    // Once it says so, nothing.
    api.carve_status(&c, &[device("gpu-0-mig-1g-10gb-6")], &CarveOutcome::Ready)
        .unwrap();
    let answered = api.claim(&c).unwrap();
    assert_eq!(
        on_claim_seen(&answered, NODE, Some(&carved)),
        OnClaimSeen::Nothing
    );
    // Deallocated.
    api.change(&c, |rc| rc.status.as_mut().unwrap().allocation = None);
    let rc = api.claim(&c).unwrap();
    assert_eq!(
        on_claim_seen(&rc, NODE, Some(&carved)),
        OnClaimSeen::ReleaseCarved
    );
    // Allocated another device.
    let c = api.allocate("ns", "c", "uid-c", &[("gpu", "gpu-0-mig-1g-10gb-5")]);
    let rc = api.claim(&c).unwrap();
    assert_eq!(
        on_claim_seen(&rc, NODE, Some(&carved)),
        OnClaimSeen::ReleaseCarved
    );
    // A prepared record is never released by the watch.
    assert_eq!(
        on_claim_seen(&rc, NODE, Some(&record(PrepareState::PrepareCompleted))),
        OnClaimSeen::Nothing
    );
}

#[test]
fn which_failures_are_answered_with_slice_failed() {
    assert!(fails_the_carve(&PrepareError::Internal("x".into())));
    assert!(fails_the_carve(&PrepareError::PlacementHeld {
        device: "d".into(),
        holders: vec![]
    }));
    assert!(!fails_the_carve(&PrepareError::ClaimGone));
    assert!(!fails_the_carve(&PrepareError::NotAllocated));
}

#[test]
fn the_carve_status_bodies_carry_one_condition_per_device() {
    let c = ClaimRef {
        namespace: "ns".into(),
        name: "c".into(),
        uid: "uid-c".into(),
    };
    let d = device("gpu-0-mig-1g-10gb-6");
    let ready = carve_status_body(&c, std::slice::from_ref(&d), &CarveOutcome::Ready, now());
    assert_eq!(ready["metadata"]["uid"], "uid-c");
    let entry = &ready["status"]["devices"][0];
    assert_eq!(entry["driver"], "mig.das.com");
    assert_eq!(entry["pool"], NODE);
    assert_eq!(entry["device"], "gpu-0-mig-1g-10gb-6");
    assert!(entry.get("data").is_none(), "{entry}");
    let conditions = entry["conditions"].as_array().unwrap();
    assert_eq!(conditions.len(), 1);
    assert_eq!(conditions[0]["type"], "mig.das.com/SliceReady");
    assert_eq!(conditions[0]["status"], "True");
    assert_eq!(conditions[0]["reason"], "SliceCarved");
    assert!(
        conditions[0]["message"]
            .as_str()
            .unwrap()
            .contains("MIG-abc"),
        "{entry}"
    );
    let failed = CarveOutcome::Failed("the create failed".into());
    let body = carve_status_body(&c, &[d], &failed, now());
    let condition = &body["status"]["devices"][0]["conditions"][0];
    assert_eq!(condition["type"], "mig.das.com/SliceFailed");
    assert_eq!(condition["reason"], "CarveFailed");
    assert_eq!(condition["message"], "the create failed");
}

#[test]
fn the_prepares_status_keeps_slice_ready_when_carving() {
    let c = ClaimRef {
        namespace: "ns".into(),
        name: "c".into(),
        uid: "uid-c".into(),
    };
    let types = |body: &serde_json::Value| -> Vec<String> {
        body["status"]["devices"][0]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["type"].as_str().unwrap().to_string())
            .collect()
    };
    let d = device("gpu-0-mig-1g-10gb-6");
    let off = status_apply_body_with(&c, std::slice::from_ref(&d), now(), false);
    assert_eq!(types(&off), ["Ready"]);
    let on = status_apply_body_with(&c, std::slice::from_ref(&d), now(), true);
    assert_eq!(types(&on), ["Ready", "mig.das.com/SliceReady"]);
    assert_eq!(on["status"]["devices"][0]["data"]["migUUID"], "MIG-abc");
}

#[test]
fn unresolvable_allocations_still_name_their_devices() {
    let (_, _, rc) = claim(true);
    let devices = allocated_devices(Some(&rc), NODE);
    let names: Vec<&str> = devices.iter().map(|d| d.device.as_str()).collect();
    assert_eq!(names, ["gpu-0-mig-1g-10gb-6"]);
    assert!(allocated_devices(Some(&rc), "another-node").is_empty());
    assert!(allocated_devices(None, NODE).is_empty());
}
