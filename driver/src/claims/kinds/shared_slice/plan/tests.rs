//! Unit tests of [`super`] (`share.rs`): a share's limits from its allocation, and the rules of
//! joining and leaving a shared slice.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::*;
use crate::claims::plan::{
    DeviceKind, DeviceRef, placement_holders, record, recorded_unshared_elsewhere,
};
use crate::mps::MpsLimits;

const DEVICE: &str = "gpu-0-mig-1g-10gb-2-shared";

fn result(share_id: Option<&str>, consumed: &[(&str, &str)]) -> DeviceRequestAllocationResult {
    DeviceRequestAllocationResult {
        request: "share".into(),
        driver: das_api::DRIVER_NAME.into(),
        pool: "n0".into(),
        device: DEVICE.into(),
        share_id: share_id.map(str::to_string),
        consumed_capacity: Some(
            consumed
                .iter()
                .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                .collect::<BTreeMap<_, _>>(),
        ),
        ..Default::default()
    }
}

fn share(id: &str) -> Share {
    Share {
        id: id.into(),
        shares: 1,
        of: 4,
        memory_bytes: 2560 << 20,
    }
}

fn planned(id: &str, mps: Option<MpsLimits>) -> Planned {
    Planned {
        time_slice: None,
        request: "share".into(),
        pool: "n0".into(),
        device: DEVICE.into(),
        at: DeviceRef {
            kind: DeviceKind::Mig,
            gpu_index: 0,
            gpu_uuid: "GPU-0".into(),
            gpu_minor: 0,
            profile: "1g.10gb".into(),
            start: 2,
            size: 1,
            shared: true,
        },
        mps,
        share: Some(share(id)),
    }
}

fn limits(pct: u8) -> Option<MpsLimits> {
    Some(MpsLimits {
        active_thread_percentage: Some(pct),
        pinned_device_memory_limit_mib: None,
    })
}

fn instance(gi: u32) -> InstanceId {
    InstanceId {
        gi_id: gi,
        ci_id: 0,
        mig_uuid: format!("MIG-{gi}"),
    }
}

/// A checkpoint where claim `uid` of namespace `ns` holds share `p` in `state`, with instance
/// `gi` if given.
fn hold(cp: &mut Checkpoint, uid: &str, p: &Planned, state: PrepareState, gi: Option<u32>) {
    hold_in(cp, "ns", uid, p, state, gi);
}

/// [`hold`] by a claim of namespace `ns`.
fn hold_in(
    cp: &mut Checkpoint,
    ns: &str,
    uid: &str,
    p: &Planned,
    state: PrepareState,
    gi: Option<u32>,
) {
    let d = RecordedDevice {
        instance: gi.map(instance),
        ..record(p)
    };
    cp.set_started(uid, ns, uid, vec![d.clone()]);
    match state {
        PrepareState::PrepareStarted => {}
        PrepareState::PrepareCompleted => cp.set_completed(uid, ns, uid, vec![d], BTreeMap::new()),
        PrepareState::Releasing => cp.set_releasing(uid, ns, uid, vec![d]),
        PrepareState::Carved => cp.set_carved(uid, ns, uid, vec![d]),
        PrepareState::Repairing => cp.set_repairing(uid, ns, uid, vec![d]),
    }
}

#[test]
fn a_share_is_its_share_id_and_consumed_capacity() {
    let r = result(Some("u-1"), &[("shares", "2"), ("memory", "2560Mi")]);
    let s = share_of(DEVICE, &r, 4).unwrap();
    assert_eq!(
        s,
        Share {
            id: "u-1".into(),
            shares: 2,
            of: 4,
            memory_bytes: 2560 << 20
        }
    );
    assert_eq!((s.thread_percentage(), s.memory_mib()), (50, 2560));
    // One share of three rounds up; a share is never 0 % nor above 100 %.
    let third = Share {
        of: 3,
        shares: 1,
        ..s.clone()
    };
    assert_eq!(third.thread_percentage(), 34);
    let all = Share {
        of: 3,
        shares: 9,
        ..s
    };
    assert_eq!(all.thread_percentage(), 100);
}

#[test]
fn a_share_without_share_id_or_with_a_bad_capacity_fails_with_the_reason() {
    let e = share_of(DEVICE, &result(None, &[]), 4).unwrap_err();
    assert_eq!(e.metric_label(), "share");
    let text = e.to_string();
    assert!(
        text.starts_with(&format!("device {DEVICE} (a shared slice)")),
        "{text}"
    );
    assert!(
        text.contains("no shareID") && text.contains("DRAConsumableCapacity"),
        "{text}"
    );
    let e = share_of(DEVICE, &result(Some("u"), &[("memory", "lots")]), 4).unwrap_err();
    assert!(
        e.to_string().contains("consumed capacity memory \"lots\""),
        "{e}"
    );
    // Missing capacities are their defaults: one share, no memory named.
    let s = share_of(DEVICE, &result(Some("u"), &[]), 4).unwrap();
    assert_eq!((s.shares, s.memory_bytes), (1, 0));
}

#[test]
fn a_share_must_be_served_with_mps() {
    assert!(check_mps(&[planned("a", limits(50))]).is_ok());
    let e = check_mps(&[planned("a", None)]).unwrap_err();
    let text = e.to_string();
    assert!(text.contains("sharing.strategy MPS"), "{text}");
    assert!(text.contains("1g.10gb.shared.mig.das.com"), "{text}");
}

#[test]
fn the_first_share_creates_and_later_ones_join_with_the_same_config() {
    let mut cp = Checkpoint::new("boot");
    let a = planned("a", limits(50));
    assert!(matches!(
        on_share(&cp, "A", Some("ns"), &a),
        OnShare::Create
    ));
    // A share recorded without its instance yet (its create comes under the GPU lock) is no
    // MIG instance to join.
    hold(&mut cp, "A", &a, PrepareState::PrepareStarted, None);
    assert!(matches!(
        on_share(&cp, "B", Some("ns"), &planned("b", limits(50))),
        OnShare::Create
    ));
    hold(&mut cp, "A", &a, PrepareState::PrepareCompleted, Some(7));
    match on_share(&cp, "B", Some("ns"), &planned("b", limits(50))) {
        OnShare::Join(id) => assert_eq!(id, instance(7)),
        other => panic!("{other:?}"),
    }
    // Its own record is never a MIG instance to join.
    assert!(matches!(
        on_share(&cp, "A", Some("ns"), &a),
        OnShare::Create
    ));
    // Another config: refused, naming both.
    match on_share(&cp, "B", Some("ns"), &planned("b", limits(20))) {
        OnShare::Refuse(e) => {
            let text = e.to_string();
            assert!(text.contains("claim ns/A"), "{text}");
            assert!(
                text.contains("activeThreadPercentage 50")
                    && text.contains("activeThreadPercentage 20"),
                "{text}"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn no_share_joins_a_slice_whose_shares_are_all_leaving() {
    let mut cp = Checkpoint::new("boot");
    let a = planned("a", limits(50));
    hold(&mut cp, "A", &a, PrepareState::Releasing, Some(7));
    match on_share(&cp, "B", Some("ns"), &planned("b", limits(50))) {
        OnShare::Refuse(e) => assert!(e.to_string().contains("being released"), "{e}"),
        other => panic!("{other:?}"),
    }
    // One share staying is enough to join.
    hold(
        &mut cp,
        "C",
        &planned("c", limits(50)),
        PrepareState::PrepareCompleted,
        Some(7),
    );
    assert!(matches!(
        on_share(&cp, "B", Some("ns"), &planned("b", limits(50))),
        OnShare::Join(_)
    ));
}

#[test]
fn a_release_leaves_the_slice_to_shares_that_stay() {
    let mut cp = Checkpoint::new("boot");
    let (a, b) = (planned("a", limits(50)), planned("b", limits(50)));
    hold(&mut cp, "A", &a, PrepareState::Releasing, Some(7));
    let mine = cp.get("A").unwrap().devices[0].clone();
    // Alone: the last share destroys the MIG instance.
    assert!(!kept_by_other_shares(&cp, "A", &mine));
    // A share that joined (recorded with the instance, even before it completes) keeps it.
    hold(&mut cp, "B", &b, PrepareState::PrepareStarted, Some(7));
    assert!(kept_by_other_shares(&cp, "A", &mine));
    // Both leaving: each destroys (the second finds it gone); neither leaks it.
    hold(&mut cp, "B", &b, PrepareState::Releasing, Some(7));
    assert!(!kept_by_other_shares(&cp, "A", &mine));
    // A device held alone is never kept by anyone.
    let alone = RecordedDevice {
        share: None,
        ..mine
    };
    hold(&mut cp, "B", &b, PrepareState::PrepareCompleted, Some(7));
    assert!(!kept_by_other_shares(&cp, "A", &alone));
}

#[test]
fn shares_of_one_slice_do_not_hold_its_placement_against_each_other() {
    let mut cp = Checkpoint::new("boot");
    hold(
        &mut cp,
        "A",
        &planned("a", limits(50)),
        PrepareState::PrepareCompleted,
        Some(7),
    );
    assert!(placement_holders(&cp, "B", &[planned("b", limits(50))]).is_empty());
    // The exclusive device of the placement is held by the shares.
    let exclusive = Planned {
        device: "gpu-0-mig-1g-10gb-2".into(),
        share: None,
        mps: None,
        at: DeviceRef {
            shared: false,
            ..planned("x", None).at
        },
        ..planned("x", None)
    };
    let held = placement_holders(&cp, "B", &[exclusive]);
    assert_eq!(held.keys().collect::<Vec<_>>(), ["A"]);
}

#[test]
fn a_rebuilt_share_may_match_a_slice_another_share_recorded() {
    let mut cp = Checkpoint::new("boot");
    let a = planned("a", limits(50));
    hold(&mut cp, "A", &a, PrepareState::PrepareCompleted, Some(7));
    let live = crate::gpu::MigInstance {
        gpu_index: 0,
        gpu_uuid: "GPU-0".into(),
        gpu_minor: 0,
        profile: "1g.10gb".into(),
        profile_id: 19,
        placement: crate::gpu::Placement { start: 2, size: 1 },
        gi_id: 7,
        ci_id: 0,
        mig_uuid: "MIG-7".into(),
        gi_cap_minor: 66,
        ci_cap_minor: 67,
        created_by_das: Some(true),
    };
    assert!(!recorded_unshared_elsewhere(&cp, "B", &live));
    assert!(crate::claims::plan::recorded_elsewhere(&cp, "B", &live));
    let alone = Planned { share: None, ..a };
    hold(
        &mut cp,
        "A",
        &alone,
        PrepareState::PrepareCompleted,
        Some(7),
    );
    assert!(recorded_unshared_elsewhere(&cp, "B", &live));
}

#[test]
fn a_slice_serves_the_namespace_of_its_shares_only() {
    let mut cp = Checkpoint::new("boot");
    let a = planned("a", limits(50));
    hold_in(
        &mut cp,
        "team-a",
        "A",
        &a,
        PrepareState::PrepareCompleted,
        Some(7),
    );
    let b = planned("b", limits(50));
    // Under the GPU's lock: a claim of another namespace is refused, naming the namespace the
    // MIG instance serves, its holder and what to do; one of the same namespace joins.
    match on_share(&cp, "B", Some("team-b"), &b) {
        OnShare::Refuse(e) => {
            assert_eq!(e.metric_label(), "share");
            let text = e.to_string();
            for part in [
                DEVICE,
                "serves namespace team-a",
                "claim team-a/A",
                "namespace team-b may not join",
                "delete the pod",
                "sharing.acrossNamespaces",
            ] {
                assert!(text.contains(part), "{part:?} missing: {text}");
            }
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        on_share(&cp, "B", Some("team-a"), &b),
        OnShare::Join(_)
    ));
    // Shares may cross namespaces where the admin allows it.
    assert!(matches!(on_share(&cp, "B", None, &b), OnShare::Join(_)));
    // The namespace rule comes before the configuration's: the message a tenant gets is about
    // the tenant, whatever its config.
    match on_share(&cp, "B", Some("team-b"), &planned("b", limits(20))) {
        OnShare::Refuse(e) => assert!(e.to_string().contains("serves namespace team-a"), "{e}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_namespace_check_before_recording_counts_every_share_record() {
    let mut cp = Checkpoint::new("boot");
    let b = planned("b", limits(50));
    assert!(check_namespace(&cp, "B", Some("team-b"), std::slice::from_ref(&b)).is_ok());
    // A share of team-a recorded before its create (no instance yet) already holds the MIG instance
    // against team-b: nothing is recorded for B.
    hold_in(
        &mut cp,
        "team-a",
        "A",
        &planned("a", limits(50)),
        PrepareState::PrepareStarted,
        None,
    );
    let e = check_namespace(&cp, "B", Some("team-b"), std::slice::from_ref(&b)).unwrap_err();
    assert!(e.to_string().contains("serves namespace team-a"), "{e}");
    // So does one being released.
    hold_in(
        &mut cp,
        "team-a",
        "A",
        &planned("a", limits(50)),
        PrepareState::Releasing,
        Some(7),
    );
    assert!(check_namespace(&cp, "B", Some("team-b"), std::slice::from_ref(&b)).is_err());
    // The same namespace, the claim's own record, another device, or sharing across
    // namespaces: nothing to refuse.
    assert!(check_namespace(&cp, "B", Some("team-a"), std::slice::from_ref(&b)).is_ok());
    assert!(check_namespace(&cp, "A", Some("team-b"), std::slice::from_ref(&b)).is_ok());
    assert!(check_namespace(&cp, "B", None, std::slice::from_ref(&b)).is_ok());
    let elsewhere = Planned {
        device: "gpu-0-mig-1g-10gb-3-shared".into(),
        ..b.clone()
    };
    assert!(check_namespace(&cp, "B", Some("team-b"), &[elsewhere]).is_ok());
    // An exclusive device is nobody's share.
    let exclusive = Planned { share: None, ..b };
    assert!(check_namespace(&cp, "B", Some("team-b"), &[exclusive]).is_ok());
}

#[test]
fn of_two_namespaces_recorded_at_once_the_first_to_create_keeps_the_slice() {
    // Both passed the check before recording; both are recorded, neither has the instance.
    let mut cp = Checkpoint::new("boot");
    let (a, b) = (planned("a", limits(50)), planned("b", limits(50)));
    hold_in(
        &mut cp,
        "team-a",
        "A",
        &a,
        PrepareState::PrepareStarted,
        None,
    );
    hold_in(
        &mut cp,
        "team-b",
        "B",
        &b,
        PrepareState::PrepareStarted,
        None,
    );
    // The first under the GPU's lock creates (the other's record holds no instance) ...
    assert!(matches!(
        on_share(&cp, "A", Some("team-a"), &a),
        OnShare::Create
    ));
    hold_in(
        &mut cp,
        "team-a",
        "A",
        &a,
        PrepareState::PrepareStarted,
        Some(7),
    );
    // ... and the second is refused.
    assert!(matches!(
        on_share(&cp, "B", Some("team-b"), &b),
        OnShare::Refuse(_)
    ));
}

#[test]
fn each_shared_device_shows_the_namespace_of_its_shares() {
    let mut cp = Checkpoint::new("boot");
    assert!(share_namespaces(&cp).is_empty());
    let a = planned("a", limits(50));
    hold_in(
        &mut cp,
        "team-a",
        "A",
        &a,
        PrepareState::PrepareStarted,
        None,
    );
    let want = |v: &str| BTreeMap::from([(DEVICE.to_string(), v.to_string())]);
    // From the first record on, whatever its state.
    assert_eq!(share_namespaces(&cp), want("team-a"));
    hold_in(
        &mut cp,
        "team-a",
        "A2",
        &a,
        PrepareState::Releasing,
        Some(7),
    );
    assert_eq!(share_namespaces(&cp), want("team-a"));
    // Shares of several namespaces (made before the rule): a value no namespace has.
    hold_in(
        &mut cp,
        "team-b",
        "B",
        &a,
        PrepareState::PrepareCompleted,
        Some(7),
    );
    assert_eq!(
        share_namespaces(&cp),
        want(das_api::attributes::SHARE_NAMESPACE_SEVERAL)
    );
    // An exclusive MIG instance shows nothing; the last share's record dropped, neither does its
    // device.
    let exclusive = Planned {
        device: "gpu-0-mig-1g-10gb-3".into(),
        share: None,
        ..a
    };
    hold_in(
        &mut cp,
        "team-c",
        "C",
        &exclusive,
        PrepareState::PrepareCompleted,
        Some(8),
    );
    for uid in ["A", "A2", "B"] {
        cp.remove(uid);
    }
    assert!(share_namespaces(&cp).is_empty());
}

/// Share `id` of the whole GPU 0 (`gpu-0-shared`).
fn planned_gpu_share(id: &str, mps: Option<MpsLimits>) -> Planned {
    let p = planned(id, mps);
    Planned {
        device: das_api::shared_whole_gpu_device_name(0),
        at: DeviceRef {
            kind: DeviceKind::WholeGpu,
            profile: das_api::WHOLE_GPU_PROFILE.into(),
            start: 0,
            size: 1,
            ..p.at.clone()
        },
        ..p
    }
}

/// A checkpoint where claim `uid` of namespace `ns` holds whole-GPU share `p` in `state`,
/// marked acquired or not.
fn hold_gpu_in(
    cp: &mut Checkpoint,
    ns: &str,
    uid: &str,
    p: &Planned,
    state: PrepareState,
    acquired: bool,
) {
    hold_in(cp, ns, uid, p, state, None);
    if let Some(d) = cp.claims.get_mut(uid).and_then(|r| r.devices.get_mut(0)) {
        d.acquired = acquired;
    }
}

/// Shares of a whole GPU create no instance: the `acquired` mark, set under the GPU's lock, is
/// what makes a share a holder. Two first shares of different namespaces, both recorded before
/// either took the lock: the first to decide holds the GPU, the second is refused; without the
/// mark both would hold it.
#[test]
fn of_two_namespaces_sharing_a_whole_gpu_the_first_to_acquire_keeps_it() {
    let mut cp = Checkpoint::new("boot");
    let (a, b) = (
        planned_gpu_share("a", limits(50)),
        planned_gpu_share("b", limits(50)),
    );
    hold_gpu_in(
        &mut cp,
        "team-a",
        "A",
        &a,
        PrepareState::PrepareStarted,
        false,
    );
    hold_gpu_in(
        &mut cp,
        "team-b",
        "B",
        &b,
        PrepareState::PrepareStarted,
        false,
    );
    // The other's record alone does not hold the GPU: whoever decides first may hold it.
    assert!(matches!(
        on_share(&cp, "A", Some("team-a"), &a),
        OnShare::Create
    ));
    hold_gpu_in(
        &mut cp,
        "team-a",
        "A",
        &a,
        PrepareState::PrepareStarted,
        true,
    );
    match on_share(&cp, "B", Some("team-b"), &b) {
        OnShare::Refuse(e) => assert!(e.to_string().contains("team-a"), "{e}"),
        other => panic!("the second namespace is refused, not {other:?}"),
    }
    // A share of the same namespace joins the GPU; one leaving keeps it for the other.
    let c = planned_gpu_share("c", limits(50));
    assert!(matches!(
        on_share(&cp, "C", Some("team-a"), &c),
        OnShare::JoinGpu
    ));
    hold_gpu_in(
        &mut cp,
        "team-a",
        "C",
        &c,
        PrepareState::PrepareCompleted,
        true,
    );
    assert!(kept_by_other_shares(&cp, "A", &record(&a)));
    // Once the holders leave, nothing keeps the GPU's daemon.
    hold_gpu_in(&mut cp, "team-a", "C", &c, PrepareState::Releasing, true);
    assert!(!kept_by_other_shares(&cp, "A", &record(&a)));
    // A share with another config may not join the GPU's daemon.
    let d = planned_gpu_share("d", limits(20));
    assert!(matches!(
        on_share(&cp, "D", Some("team-a"), &d),
        OnShare::Refuse(_)
    ));
}

/// A share of a whole GPU that is not served with MPS is refused with the classes to use: the
/// shared one, or the whole GPU's for a claim that wants the GPU alone.
#[test]
fn a_whole_gpu_share_without_mps_names_the_whole_gpu_class() {
    let e = check_mps(&[planned_gpu_share("a", None)]).unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("gpu.shared.mig.das.com") && text.contains(das_api::DEVICE_CLASS_WHOLE_GPU),
        "{text}"
    );
    assert!(!text.contains("gpu.mig.das.com"), "{text}");
}
