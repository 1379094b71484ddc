//! Unit tests of [`super`] (`book.rs`).

use super::*;

fn at(s: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(s)
}

fn book() -> HealthBook {
    HealthBook::new(
        HealthPolicy {
            quiet_period: Duration::from_secs(60),
            ..HealthPolicy::default()
        },
        [0, 1],
    )
}

fn xid(gpu: u32, xid: u32) -> HealthEvent {
    HealthEvent::Xid {
        gpu,
        xid,
        gpu_instance: None,
    }
}

#[test]
fn a_fatal_xid_taints_its_gpu_until_the_quiet_period_passes() {
    let mut b = book();
    assert_eq!(
        b.observe_event(&xid(0, 79), &[], at(100)),
        Some(Transition::Unhealthy {
            gpu: 0,
            cause: Cause::Xid(79)
        })
    );
    assert_eq!(
        b.taints(0),
        [GpuTaint {
            key: health_taints::XID,
            value: "79".into(),
            since: at(100)
        }]
    );
    assert!(b.taints(1).is_empty(), "the other GPU is untouched");
    // A second fatal XID restarts the quiet period; the taint keeps its start, shows the latest.
    assert_eq!(
        b.observe_event(&xid(0, 48), &[], at(130)),
        Some(Transition::Unhealthy {
            gpu: 0,
            cause: Cause::Xid(48)
        })
    );
    assert_eq!(
        b.observe_event(&xid(0, 48), &[], at(140)),
        None,
        "the same cause again"
    );
    assert!(b.expire(at(199)).is_empty());
    assert_eq!(b.taints(0)[0].value, "48");
    assert_eq!(b.taints(0)[0].since, at(100));
    assert_eq!(b.expire(at(200)), [Transition::Recovered { gpu: 0 }]);
    assert!(b.taints(0).is_empty() && b.reason(0).is_none());
}

#[test]
fn application_and_ignored_xids_change_nothing() {
    let mut b = HealthBook::new(
        HealthPolicy {
            ignored_xids: BTreeSet::from([119]),
            ..HealthPolicy::default()
        },
        [0],
    );
    for x in [13, 31, 43, 45, 68, 119] {
        assert_eq!(
            b.observe_event(&xid(0, x), &[], at(1)),
            Some(Transition::NonFatalXid { gpu: 0, xid: x })
        );
    }
    assert!(b.healthy(0));
}

#[test]
fn a_lost_gpu_is_tainted_until_it_answers_for_the_quiet_period() {
    let mut b = book();
    let only_1 = BTreeSet::from([1]);
    let both = BTreeSet::from([0, 1]);
    assert_eq!(
        b.observe_inventory(&only_1, at(10)),
        [Transition::Unhealthy {
            gpu: 0,
            cause: Cause::Lost
        }]
    );
    assert!(
        b.observe_inventory(&only_1, at(20)).is_empty(),
        "reported once"
    );
    assert_eq!(b.taints(0)[0].key, health_taints::GPU_LOST);
    assert!(b.expire(at(1000)).is_empty(), "a lost GPU never expires");
    assert!(b.observe_inventory(&both, at(1000)).is_empty());
    assert_eq!(
        b.taints(0)[0].key,
        health_taints::GPU_LOST,
        "still tainted while quiet"
    );
    assert_eq!(b.taints(0)[0].since, at(10));
    assert!(b.reason(0).unwrap().contains("answers again"));
    assert!(b.expire(at(1059)).is_empty());
    assert_eq!(b.expire(at(1060)), [Transition::Recovered { gpu: 0 }]);
    assert!(b.healthy(0) && b.healthy(1));
}

#[test]
fn a_lost_gpu_with_a_fatal_xid_carries_both_taints() {
    let mut b = book();
    b.observe_event(&HealthEvent::UncorrectableEcc { gpu: 1 }, &[], at(5));
    b.observe_inventory(&BTreeSet::from([0]), at(6));
    let keys: Vec<_> = b.taints(1).iter().map(|t| t.key).collect();
    assert_eq!(keys, [health_taints::GPU_LOST, health_taints::ECC]);
    assert!(b.reason(1).unwrap().contains("does not answer"));
    // Events about GPUs the plugin does not manage are dropped.
    assert_eq!(b.observe_event(&xid(7, 79), &[], at(7)), None);
}

/// Instance `gi` of profile `profile` at memory slices `start..start + size` of GPU `gpu`.
fn live(gpu: u32, gi: u32, profile: &str, start: u32, size: u32) -> MigInstance {
    MigInstance {
        gpu_index: gpu,
        gpu_uuid: format!("GPU-{gpu}"),
        gpu_minor: gpu,
        profile: profile.into(),
        profile_id: 0,
        placement: Placement { start, size },
        gi_id: gi,
        ci_id: 0,
        mig_uuid: format!("MIG-{gpu}-{gi}"),
        gi_cap_minor: 0,
        ci_cap_minor: 0,
        created_by_das: Some(true),
    }
}

/// On GPU 0: GPU instance 3 at memory slice 0 (X) and 5 at memory slice 1 (Y); on GPU 1,
/// GPU instance 7 at memory slice 0.
fn two_instances() -> Vec<MigInstance> {
    vec![
        live(0, 3, "1g.6gb", 0, 1),
        live(0, 5, "1g.6gb", 1, 1),
        live(1, 7, "1g.6gb", 0, 1),
    ]
}

fn xid_on(gpu: u32, xid: u32, gi: u32) -> HealthEvent {
    HealthEvent::Xid {
        gpu,
        xid,
        gpu_instance: Some(gi),
    }
}

fn p(start: u32, size: u32) -> Placement {
    Placement { start, size }
}

fn tainted(b: &HealthBook, gpu: u32, placement: Placement) -> bool {
    !b.device_taints(gpu, placement).is_empty()
}

#[test]
fn an_xid_naming_a_gpu_instance_taints_only_the_devices_overlapping_its_placement() {
    let mut b = book();
    let x = GpuInstance {
        id: 3,
        profile: "1g.6gb".into(),
        placement: p(0, 1),
    };
    assert_eq!(
        b.observe_event(&xid_on(0, 94, 3), &two_instances(), at(100)),
        Some(Transition::InstanceUnhealthy {
            gpu: 0,
            instance: x.clone(),
            cause: Cause::Xid(94)
        })
    );
    // X's device, and the larger ones over its memory slice, are tainted ...
    for placement in [p(0, 1), p(0, 2), p(0, 4)] {
        assert_eq!(
            b.device_taints(0, placement),
            [GpuTaint {
                key: health_taints::XID,
                value: "94".into(),
                since: at(100)
            }],
            "{placement}"
        );
    }
    // ... Y's device on the next memory slice, and the rest of the GPU, are not.
    for placement in [p(1, 1), p(2, 1), p(3, 1), p(2, 2)] {
        assert!(!tainted(&b, 0, placement), "{placement}");
    }
    assert!(b.taints(0).is_empty(), "nothing GPU-wide");
    assert!(!tainted(&b, 1, p(0, 1)), "the other GPU is untouched");
    assert!(!b.healthy(0) && b.healthy(1));
    assert!(b.reason(0).is_none());
    let why = b.device_reason(0, p(0, 2)).unwrap();
    assert!(
        why.contains("XID 94") && why.contains("GPU instance 3 (1g.6gb at memory slices 0:1)"),
        "{why}"
    );
    assert_eq!(b.device_reason(0, p(1, 1)), None);
    assert_eq!(b.instance_taints(0, p(0, 1)).len(), 1);

    // It recovers on its own quiet period.
    assert!(b.expire(at(159)).is_empty());
    assert_eq!(
        b.expire(at(160)),
        [Transition::InstanceRecovered {
            gpu: 0,
            instance: x
        }]
    );
    assert!(b.healthy(0) && !tainted(&b, 0, p(0, 1)));
}

#[test]
fn an_xid_naming_no_gpu_instance_taints_the_whole_gpu() {
    let mut b = book();
    assert_eq!(
        b.observe_event(&xid(0, 94), &two_instances(), at(1)),
        Some(Transition::Unhealthy {
            gpu: 0,
            cause: Cause::Xid(94)
        })
    );
    for placement in [p(0, 1), p(1, 1), p(2, 2), p(0, 4)] {
        assert!(tainted(&b, 0, placement), "{placement}");
    }
    assert!(!tainted(&b, 1, p(0, 1)));
}

#[test]
fn an_id_no_live_instance_has_falls_back_to_the_whole_gpu() {
    let mut b = book();
    // GI 7 lives on GPU 1, not GPU 0: ids are per GPU.
    for gi in [9, 7] {
        assert_eq!(
            b.observe_event(&xid_on(0, 94, gi), &two_instances(), at(1)),
            (gi == 9).then_some(Transition::Unhealthy {
                gpu: 0,
                cause: Cause::Xid(94)
            }),
            "GI {gi}"
        );
        assert!(
            tainted(&b, 0, p(1, 1)) && tainted(&b, 0, p(3, 1)),
            "GI {gi}"
        );
    }
    // The instances could not be read: the whole GPU too.
    assert_eq!(
        b.observe_event(&xid_on(1, 94, 7), &[], at(1)),
        Some(Transition::Unhealthy {
            gpu: 1,
            cause: Cause::Xid(94)
        })
    );
    assert!(tainted(&b, 1, p(3, 1)));
}

#[test]
fn gpu_wide_errors_taint_the_whole_gpu_even_when_they_name_an_instance() {
    for event in [xid_on(0, 79, 3), xid_on(0, 95, 3), xid_on(0, 48, 3)] {
        assert_eq!(scope(&event, &two_instances()), Scope::Gpu, "{event:?}");
        let mut b = book();
        b.observe_event(&event, &two_instances(), at(1));
        assert!(tainted(&b, 0, p(3, 1)), "{event:?}");
    }
    assert_eq!(
        scope(&HealthEvent::UncorrectableEcc { gpu: 0 }, &two_instances()),
        Scope::Gpu
    );
}

#[test]
fn a_device_carries_one_taint_per_key_when_its_gpu_and_an_instance_are_both_unhealthy() {
    let mut b = book();
    b.observe_event(&xid_on(0, 94, 3), &two_instances(), at(1));
    b.observe_event(&xid(0, 119), &[], at(2));
    b.observe_inventory(&BTreeSet::from([1]), at(3));
    let on_x: Vec<_> = b
        .device_taints(0, p(0, 1))
        .into_iter()
        .map(|t| (t.key, t.value))
        .collect();
    assert_eq!(
        on_x,
        [
            (health_taints::GPU_LOST, "true".to_string()),
            (health_taints::XID, "119".to_string())
        ],
        "the GPU's XID taint wins over the instance's"
    );
    // The GPU recovering leaves the instance's own quiet period running.
    b.observe_inventory(&BTreeSet::from([0, 1]), at(4));
    assert_eq!(
        b.expire(at(61)),
        [Transition::InstanceRecovered {
            gpu: 0,
            instance: GpuInstance {
                id: 3,
                profile: "1g.6gb".into(),
                placement: p(0, 1)
            }
        }]
    );
    assert_eq!(b.expire(at(64)), [Transition::Recovered { gpu: 0 }]);
}
