//! Unit tests of [`super`] (`gates/guard.rs`): the two calls, round by round.

use std::time::Duration;

use serde_json::{Value, json};

use super::*;
use crate::resourceslice::gates::MAX_PROBE_RETRY;

const S: Duration = Duration::from_secs(1);

fn spec(v: Value) -> ResourceSliceSpec {
    let mut v = v;
    v["driver"] = json!("dev.example.com");
    v["nodeName"] = json!("n0");
    v["pool"] = json!({"name": "n0", "generation": 0, "resourceSliceCount": 2});
    serde_json::from_value(v).unwrap()
}

/// A counter slice and a device slice consuming it: `gpu-0-1g-0` exclusive, with binding
/// conditions when `bound`, beside the shareable `gpu-0-1g-0-shared` when `shared`.
fn desired(shared: bool, bound: bool) -> Vec<ResourceSliceSpec> {
    let counters = spec(json!({"sharedCounters": [
        {"name": "gpu-0", "counters": {"memory-slice-0": {"value": "1"}}}]}));
    let consumes = json!([{"counterSet": "gpu-0", "counters": {"memory-slice-0": {"value": "1"}}}]);
    let mut exclusive = json!({"name": "gpu-0-1g-0", "consumesCounters": consumes,
                               "attributes": {"type": {"string": "mig"}}});
    if bound {
        exclusive["bindingConditions"] = json!(["dev.example.com/SliceReady"]);
        exclusive["bindingFailureConditions"] = json!(["dev.example.com/SliceFailed"]);
    }
    let mut devices = vec![exclusive];
    if shared {
        devices.push(
            json!({"name": "gpu-0-1g-0-shared", "consumesCounters": consumes,
            "allowMultipleAllocations": true,
            "attributes": {"type": {"string": "mig-shared"}},
            "capacity": {"shares": {"value": "4", "requestPolicy": {"default": "1"}}}}),
        );
    }
    vec![counters, spec(json!({"devices": devices}))]
}

/// Slices without shared counters (whole GPUs only).
fn plain() -> Vec<ResourceSliceSpec> {
    vec![spec(json!({"devices": [{"name": "gpu-0"}]}))]
}

fn wrote(counters: bool, dropped: Dropped) -> Observed {
    Observed::Wrote(Written {
        counters,
        taints: false,
        dropped,
    })
}

fn kept() -> Observed {
    wrote(true, Dropped::default())
}

fn full(specs: Vec<ResourceSliceSpec>) -> Attempt {
    Attempt::Write {
        specs,
        withdrawn: false,
    }
}

fn withdrawn() -> Attempt {
    Attempt::Write {
        specs: Vec::new(),
        withdrawn: true,
    }
}

fn observation(notices: Vec<Notice>, again: bool) -> Observation {
    Observation { notices, again }
}

fn devices(a: &Attempt) -> Vec<String> {
    match a {
        Attempt::Write { specs, .. } => specs
            .iter()
            .flat_map(|s| s.devices.iter().flatten())
            .map(|d| d.name.clone())
            .collect(),
        Attempt::Probe(_) => panic!("a probe: {a:?}"),
    }
}

#[test]
fn a_first_publish_probes_one_counter_slice_then_writes_the_desired_slices() {
    let mut g = Guard::default();
    let t = Instant::now();
    let want = desired(false, false);
    assert_eq!(g.plan(&want, t), Attempt::Probe(want[0].clone()));
    let o = g.observe(Observed::Probe(ProbeAnswer::Kept), t);
    assert_eq!(o, observation(vec![], true), "a write follows every probe");
    assert_eq!(g.plan(&want, t), full(want.clone()));
    assert_eq!(g.observe(kept(), t), observation(vec![], false));
    // The next publish: counters known kept, no probe until the recheck is due.
    assert_eq!(g.plan(&want, t + S), full(want.clone()));
    assert_eq!(g.observe(kept(), t + S), observation(vec![], false));
    assert!(matches!(
        g.plan(&want, t + MAX_PROBE_RETRY),
        Attempt::Probe(_)
    ));
}

#[test]
fn slices_without_counters_are_written_without_a_probe() {
    let mut g = Guard::default();
    let t = Instant::now();
    assert_eq!(g.plan(&plain(), t), full(plain()));
    assert_eq!(
        g.observe(wrote(false, Dropped::default()), t),
        observation(vec![], false)
    );
}

#[test]
fn dropped_counters_withdraw_the_pool_until_a_probe_shows_them_kept() {
    let mut g = Guard::new(10 * S, 40 * S);
    let t = Instant::now();
    let want = desired(false, false);
    assert!(matches!(g.plan(&want, t), Attempt::Probe(_)));
    let o = g.observe(Observed::Probe(ProbeAnswer::Dropped), t);
    let dropped = Notice::CountersDropped {
        first: true,
        retry_in: 10 * S,
    };
    assert_eq!(o, observation(vec![dropped], true));
    assert_eq!(g.plan(&want, t), withdrawn());
    let empty = wrote(false, Dropped::default());
    assert_eq!(g.observe(empty, t), observation(vec![], false));
    assert!(g.withdrawn() && g.next_probe() == Some(t + 10 * S));
    // Before the probe is due: withdrawn without asking.
    assert_eq!(g.plan(&want, t + 9 * S), withdrawn());
    g.observe(wrote(false, Dropped::default()), t + 9 * S);
    // Due, and kept now: the desired slices again, and a Normal notice.
    assert!(matches!(g.plan(&want, t + 10 * S), Attempt::Probe(_)));
    let o = g.observe(Observed::Probe(ProbeAnswer::Kept), t + 10 * S);
    assert_eq!(o, observation(vec![Notice::CountersKept], true));
    assert_eq!(g.plan(&want, t + 10 * S), full(want.clone()));
    assert_eq!(g.gates_off()[0], (PARTITIONABLE_DEVICES, false));
}

#[test]
fn a_failed_probe_is_not_repeated_within_a_publish_but_is_at_the_next() {
    let mut g = Guard::default();
    let t = Instant::now();
    let want = desired(false, false);
    assert!(matches!(g.plan(&want, t), Attempt::Probe(_)));
    let o = g.observe(Observed::Probe(ProbeAnswer::Failed), t);
    assert_eq!(o, observation(vec![], true));
    // No verdict: the desired slices are written and their writes checked instead.
    assert_eq!(g.plan(&want, t), full(want.clone()));
    let o = g.observe(wrote(false, Dropped::default()), t);
    assert_eq!(o, observation(vec![], false));
    // Nothing with counters was written (the slices were up to date): still unknown.
    assert!(matches!(g.plan(&want, t), Attempt::Probe(_)));
}

#[test]
fn a_publish_whose_write_failed_is_followed_by_a_new_one() {
    let mut g = Guard::default();
    let t = Instant::now();
    let want = desired(false, false);
    assert!(matches!(g.plan(&want, t), Attempt::Probe(_)));
    g.observe(Observed::Probe(ProbeAnswer::Failed), t);
    assert_eq!(g.plan(&want, t), full(want.clone()));
    // The write failed, so it was never observed: the next plan starts a new publish.
    assert!(matches!(g.plan(&want, t), Attempt::Probe(_)));
}

#[test]
fn a_write_that_loses_its_counters_is_followed_by_the_pool_without_devices() {
    let mut g = Guard::default();
    let t = Instant::now();
    let want = desired(false, false);
    g.plan(&want, t);
    g.observe(Observed::Probe(ProbeAnswer::Failed), t);
    g.plan(&want, t);
    let lost = Dropped {
        counters: true,
        ..Dropped::default()
    };
    let o = g.observe(wrote(true, lost), t);
    assert!(o.again, "{o:?}");
    assert!(matches!(
        o.notices[..],
        [Notice::CountersDropped { first: true, .. }]
    ));
    assert_eq!(g.plan(&want, t), withdrawn());
    let o = g.observe(wrote(false, Dropped::default()), t);
    assert_eq!(o, observation(vec![], false));
    assert!(g.withdrawn());
}

#[test]
fn lost_shares_and_binding_conditions_are_left_out_of_a_second_write_at_once_and_after() {
    let mut g = Guard::default();
    let t = Instant::now();
    let want = desired(true, true);
    g.plan(&want, t);
    g.observe(Observed::Probe(ProbeAnswer::Kept), t);
    assert_eq!(g.plan(&want, t), full(want.clone()));
    let lost = Dropped {
        shares: true,
        binding: true,
        ..Dropped::default()
    };
    let o = g.observe(wrote(true, lost), t);
    let told = vec![Notice::SharesDropped, Notice::BindingConditionsDropped];
    assert_eq!(o, observation(told, true));
    // Once more, without either: what a server without the gates has no way to misread.
    let again = g.plan(&want, t);
    assert_eq!(devices(&again), ["gpu-0-1g-0"]);
    let Attempt::Write { specs, .. } = &again else {
        unreachable!()
    };
    assert_eq!(specs.len(), 2, "the counter slice stays");
    let d = &specs[1].devices.as_ref().unwrap()[0];
    assert!(d.binding_conditions.is_none() && d.binding_failure_conditions.is_none());
    assert_eq!(g.observe(kept(), t), observation(vec![], false));
    // And at every later publish, without telling again.
    assert_eq!(g.plan(&want, t + S), again);
    assert_eq!(g.observe(kept(), t + S), observation(vec![], false));
    assert_eq!(
        g.gates_off(),
        [
            (PARTITIONABLE_DEVICES, false),
            (DEVICE_TAINTS, false),
            (CONSUMABLE_CAPACITY, true),
            (DEVICE_BINDING_CONDITIONS, true)
        ]
    );
}

#[test]
fn a_lost_gate_whose_fields_were_not_offered_needs_no_second_write() {
    let mut g = Guard::default();
    let t = Instant::now();
    // Only a capacity's request policy was lost; no shareable device was offered.
    let want = plain();
    assert_eq!(g.plan(&want, t), full(want.clone()));
    let lost = Dropped {
        shares: true,
        ..Dropped::default()
    };
    let o = g.observe(wrote(false, lost), t);
    assert_eq!(o, observation(vec![Notice::SharesDropped], false));
}

#[test]
fn notices_come_in_a_fixed_order_and_taints_are_followed_both_ways() {
    let mut g = Guard::default();
    let t = Instant::now();
    let want = desired(true, false);
    g.plan(&want, t);
    g.observe(Observed::Probe(ProbeAnswer::Failed), t);
    g.plan(&want, t);
    let seen = Observed::Wrote(Written {
        counters: true,
        taints: true,
        dropped: Dropped {
            counters: true,
            taints: true,
            shares: true,
            binding: false,
        },
    });
    let o = g.observe(seen, t);
    assert_eq!(
        o.notices.iter().map(Notice::reason).collect::<Vec<_>>(),
        [
            "DeviceTaintsDropped",
            "ConsumableCapacityDropped",
            "SharedCountersDropped"
        ]
    );
    assert!(o.again);
    g.plan(&want, t);
    g.observe(wrote(false, Dropped::default()), t);
    assert!(g.taints_dropped());
    // Taints written and kept: a Normal notice, the devices never withdrawn for taints.
    let mut g = Guard::default();
    g.plan(&plain(), t);
    let seen = |dropped| {
        Observed::Wrote(Written {
            counters: false,
            taints: true,
            dropped: Dropped {
                taints: dropped,
                ..Dropped::default()
            },
        })
    };
    assert_eq!(g.observe(seen(true), t).notices, [Notice::TaintsDropped]);
    g.plan(&plain(), t);
    assert_eq!(g.observe(seen(false), t).notices, [Notice::TaintsKept]);
    assert!(!g.withdrawn() && !g.taints_dropped());
}

#[test]
fn a_publish_has_at_most_max_attempts() {
    let mut g = Guard::default();
    let t = Instant::now();
    let want = desired(true, true);
    g.plan(&want, t);
    g.observe(Observed::Probe(ProbeAnswer::Failed), t);
    // Each write shows another gate off for the first time.
    let lost = [
        Dropped {
            shares: true,
            ..Dropped::default()
        },
        Dropped {
            binding: true,
            ..Dropped::default()
        },
        Dropped {
            counters: true,
            ..Dropped::default()
        },
    ];
    let mut agains = Vec::new();
    for dropped in lost {
        assert!(matches!(g.plan(&want, t), Attempt::Write { .. }));
        agains.push(g.observe(wrote(true, dropped), t).again);
    }
    assert_eq!(
        agains,
        [true, true, false],
        "the fourth attempt is the last"
    );
    assert_eq!(MAX_ATTEMPTS, 4);
    // The next publish is a new one: withdrawn, without a probe before it is due.
    assert_eq!(g.plan(&want, t), withdrawn());
}

#[test]
fn what_the_server_kept_is_read_from_the_specs() {
    let want = desired(true, true);
    let mut stored = want[1].clone();
    for d in stored.devices.iter_mut().flatten() {
        d.consumes_counters = None;
        d.allow_multiple_allocations = None;
    }
    assert_eq!(ProbeAnswer::of(&want[1], &want[1]), ProbeAnswer::Kept);
    assert_eq!(ProbeAnswer::of(&want[1], &stored), ProbeAnswer::Dropped);
    let mut w = Written::default();
    w.add(&want[0], &want[0]);
    assert!(w.counters && !w.taints && w.dropped == Dropped::default());
    w.add(&want[1], &stored);
    assert_eq!(
        w.dropped,
        Dropped {
            counters: true,
            shares: true,
            ..Dropped::default()
        }
    );
}
