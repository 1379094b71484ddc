//! Unit tests of [`super`] (`gates.rs`): what counts as dropped, and the guard's decisions from
//! what was written and what came back.

use super::*;
use serde_json::{Value, json};

fn pool() -> Pool {
    Pool::new("dev.example.com", "n0")
}

/// A 1.35 counter-only slice key.
fn counter_slice() -> Value {
    json!({"driver": "dev.example.com", "nodeName": "n0",
           "pool": {"name": "n0", "generation": 0, "resourceSliceCount": 2},
           "sharedCounters": [{"name": "gpu-0", "counters": {"memory-slice-0": {"value": "1"}}}]})
}

/// A device slice key: `gpu-0-1g-0` consuming counters, `taints` on it when `tainted`.
fn device_slice(counters: bool, tainted: bool) -> Value {
    let mut device = json!({"name": "gpu-0-1g-0", "attributes": {"type": {"string": "mig"}}});
    if counters {
        device["consumesCounters"] = json!([{"counterSet": "gpu-0",
            "counters": {"memory-slice-0": {"value": "1"}}}]);
    }
    if tainted {
        device["taints"] = json!([{"key": "dev.example.com/unhealthy", "effect": "NoSchedule"}]);
    }
    json!({"driver": "dev.example.com", "nodeName": "n0",
           "pool": {"name": "n0", "generation": 0, "resourceSliceCount": 2},
           "devices": [device]})
}

/// What a server with the gates off stores: `dropDisabledFields` on create.
fn gate_off(mut key: Value, counters: bool, taints: bool) -> Value {
    let o = key.as_object_mut().unwrap();
    if counters {
        o.remove("sharedCounters");
    }
    for d in o
        .get_mut("devices")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        let d = d.as_object_mut().unwrap();
        if counters {
            d.remove("consumesCounters");
        }
        if taints {
            d.remove("taints");
        }
    }
    key
}

#[test]
fn dropped_counters_and_taints_are_told_apart() {
    let counters = counter_slice();
    assert!(carries_counters(&counters) && !carries_taints(&counters));
    assert_eq!(dropped(&counters, &counters), Dropped::default());
    assert_eq!(
        dropped(&counters, &gate_off(counters.clone(), true, false)),
        Dropped {
            counters: true,
            taints: false,
            shares: false,
            binding: false
        },
        "a counter-only slice stored empty lost its counter set"
    );

    let devices = device_slice(true, true);
    assert!(carries_counters(&devices) && carries_taints(&devices));
    assert_eq!(
        dropped(&devices, &gate_off(devices.clone(), true, false)),
        Dropped {
            counters: true,
            taints: false,
            shares: false,
            binding: false
        }
    );
    assert_eq!(
        dropped(&devices, &gate_off(devices.clone(), false, true)),
        Dropped {
            counters: false,
            taints: true,
            shares: false,
            binding: false
        }
    );
    assert_eq!(
        dropped(&devices, &gate_off(devices.clone(), true, true)),
        Dropped {
            counters: true,
            taints: true,
            shares: false,
            binding: false
        }
    );
}

#[test]
fn other_differences_are_not_counted_as_dropped_counters() {
    let sent = device_slice(true, false);
    // The server canonicalized or dropped something else (another gate).
    let mut stored = sent.clone();
    stored["devices"][0]["attributes"] = json!({});
    assert_eq!(dropped(&sent, &stored), Dropped::default());
    // Nothing gated was sent: nothing can be dropped.
    let plain = device_slice(false, false);
    assert!(!carries_counters(&plain));
    assert_eq!(
        dropped(&plain, &gate_off(plain.clone(), true, true)),
        Dropped::default()
    );
}

fn now() -> Instant {
    Instant::now()
}

const S: Duration = Duration::from_secs(1);

#[test]
fn counters_are_probed_before_they_are_first_published() {
    let g = CounterGuard::default();
    assert_eq!(g.counters(), Counters::Unknown);
    assert_eq!(g.before_publish(true, now()), Step::Probe);
    // A pool without counters (no MIG GPU) has nothing to overlap: published as it is.
    assert_eq!(g.before_publish(false, now()), Step::Publish(Offer::Full));
}

#[test]
fn kept_counters_publish_the_devices_and_are_checked_again_at_most_every_max_retry() {
    let mut g = CounterGuard::new(10 * S, 300 * S);
    let t = now();
    let d = g.probed(ProbeAnswer::Kept, t);
    assert_eq!(
        d,
        Decision {
            offer: Offer::Full,
            notice: None
        }
    );
    assert_eq!(g.counters(), Counters::Kept);
    assert!(!g.withdrawn() && g.next_probe().is_none());
    // No probe before the recheck is due (publishes on every change stay one call cheaper).
    assert_eq!(
        g.before_publish(true, t + 299 * S),
        Step::Publish(Offer::Full)
    );
    // Due (the next 5 min resync): the server may have been restarted with the gate off.
    assert_eq!(g.before_publish(true, t + 300 * S), Step::Probe);
    let d = g.probed(ProbeAnswer::Dropped, t + 300 * S);
    assert_eq!(d.offer, Offer::Withdrawn);
    assert!(matches!(
        d.notice,
        Some(Notice::CountersDropped { first: true, .. })
    ));
    // A failed recheck publishes and waits for the next one.
    let mut g = CounterGuard::new(10 * S, 300 * S);
    g.probed(ProbeAnswer::Kept, t);
    assert_eq!(
        g.probed(ProbeAnswer::Failed, t + 300 * S),
        Decision {
            offer: Offer::Full,
            notice: None
        }
    );
    assert_eq!(
        g.before_publish(true, t + 599 * S),
        Step::Publish(Offer::Full)
    );
    assert_eq!(g.before_publish(true, t + 600 * S), Step::Probe);
}

#[test]
fn dropped_counters_withdraw_the_devices_warn_and_probe_again_with_backoff() {
    let mut g = CounterGuard::new(10 * S, 40 * S);
    let t = now();
    let d = g.probed(ProbeAnswer::Dropped, t);
    assert_eq!(d.offer, Offer::Withdrawn);
    let notice = d.notice.expect("a notice");
    assert_eq!(
        notice,
        Notice::CountersDropped {
            first: true,
            retry_in: 10 * S
        }
    );
    assert!(notice.is_warning());
    assert_eq!(notice.gate(), "DRAPartitionableDevices");
    assert_eq!(notice.reason(), "SharedCountersDropped");
    let note = notice.note(&pool());
    for want in [
        "DRAPartitionableDevices",
        "kube-apiserver and kube-scheduler",
        "--feature-gates=DRAPartitionableDevices=true",
        "overlapping",
        "withdrawn",
        "n0",
    ] {
        assert!(note.contains(want), "{want:?} missing from {note:?}");
    }
    assert!(note.chars().count() <= 1000, "fits an event note");
    assert!(g.withdrawn());
    assert_eq!(g.next_probe(), Some(t + 10 * S));

    // Before the probe is due, publishes stay withdrawn without asking the server.
    assert_eq!(
        g.before_publish(true, t + 9 * S),
        Step::Publish(Offer::Withdrawn)
    );
    assert_eq!(g.before_publish(true, t + 10 * S), Step::Probe);

    // Still dropped: 20 s, then 40 s (the cap), then 40 s again; the repeats are not "first".
    let mut at = t + 10 * S;
    for wait in [20, 40, 40] {
        let d = g.probed(ProbeAnswer::Dropped, at);
        assert_eq!(
            d,
            Decision {
                offer: Offer::Withdrawn,
                notice: Some(Notice::CountersDropped {
                    first: false,
                    retry_in: wait * S
                })
            }
        );
        assert_eq!(g.next_probe(), Some(at + wait * S));
        at += wait * S;
    }
}

#[test]
fn counters_kept_again_republish_the_devices_and_say_so() {
    let mut g = CounterGuard::new(10 * S, 40 * S);
    let t = now();
    g.probed(ProbeAnswer::Dropped, t);
    g.probed(ProbeAnswer::Dropped, t + 10 * S);
    let d = g.probed(ProbeAnswer::Kept, t + 30 * S);
    assert_eq!(
        d,
        Decision {
            offer: Offer::Full,
            notice: Some(Notice::CountersKept)
        }
    );
    assert!(!Notice::CountersKept.is_warning());
    assert!(!g.withdrawn() && g.next_probe().is_none());
    // Dropped again later: the backoff starts over, and the warning is "first" again.
    let d = g.probed(ProbeAnswer::Dropped, t + 100 * S);
    assert_eq!(
        d.notice,
        Some(Notice::CountersDropped {
            first: true,
            retry_in: 10 * S
        })
    );
}

#[test]
fn a_failed_probe_keeps_withdrawn_devices_withdrawn_and_otherwise_lets_the_writes_decide() {
    let mut g = CounterGuard::new(10 * S, 40 * S);
    let t = now();
    // Unknown: publish, the writes are checked.
    assert_eq!(
        g.probed(ProbeAnswer::Failed, t),
        Decision {
            offer: Offer::Full,
            notice: None
        }
    );
    assert_eq!(g.counters(), Counters::Unknown);
    // Withdrawn: stay so, probe again later (backing off).
    g.probed(ProbeAnswer::Dropped, t);
    assert_eq!(
        g.probed(ProbeAnswer::Failed, t + 10 * S),
        Decision {
            offer: Offer::Withdrawn,
            notice: None
        }
    );
    assert!(g.withdrawn());
    assert_eq!(g.next_probe(), Some(t + 30 * S));
}

#[test]
fn a_write_that_loses_its_counters_withdraws_the_devices_at_once() {
    let mut g = CounterGuard::new(10 * S, 40 * S);
    let t = now();
    // The probe failed, the desired slices were written, and the server dropped the counters.
    g.probed(ProbeAnswer::Failed, t);
    let d = g.written(true, true, t).expect("withdraw");
    assert_eq!(
        d,
        Decision {
            offer: Offer::Withdrawn,
            notice: Some(Notice::CountersDropped {
                first: true,
                retry_in: 10 * S
            })
        }
    );
    assert!(g.withdrawn());

    // Known kept, then a write (a new slice on an API server restarted with the gate off)
    // loses them: withdrawn too.
    let mut g = CounterGuard::default();
    g.probed(ProbeAnswer::Kept, t);
    assert_eq!(g.written(true, false, t), None);
    assert_eq!(
        g.written(true, true, t).map(|d| d.offer),
        Some(Offer::Withdrawn)
    );
}

#[test]
fn a_write_that_keeps_its_counters_confirms_them() {
    let mut g = CounterGuard::default();
    let t = now();
    g.probed(ProbeAnswer::Failed, t);
    assert_eq!(g.written(false, false, t), None);
    assert_eq!(
        g.counters(),
        Counters::Unknown,
        "nothing with counters written"
    );
    assert_eq!(g.written(true, false, t), None);
    assert_eq!(g.counters(), Counters::Kept);
    assert_eq!(g.before_publish(true, t), Step::Publish(Offer::Full));
    assert_eq!(g.before_publish(true, t + MAX_PROBE_RETRY), Step::Probe);
}

#[test]
fn dropped_taints_keep_the_devices_and_warn_once_per_change() {
    let mut g = Guard::default();
    assert_eq!(g.taints_written(false, false), None);
    let notice = g.taints_written(true, true).expect("a notice");
    assert_eq!(notice, Notice::TaintsDropped);
    assert!(notice.is_warning());
    assert_eq!(
        (notice.gate(), notice.reason()),
        ("DRADeviceTaints", "DeviceTaintsDropped")
    );
    let note = notice.note(&pool());
    assert!(
        note.contains("DRADeviceTaints") && note.contains("kube-apiserver"),
        "{note}"
    );
    assert!(g.taints_dropped());
    // Not again while they stay dropped; writes without taints say nothing.
    assert_eq!(g.taints_written(true, true), None);
    assert_eq!(g.taints_written(false, false), None);
    assert!(g.taints_dropped());
    // Kept again: a Normal notice, and a later drop warns again.
    assert_eq!(g.taints_written(true, false), Some(Notice::TaintsKept));
    assert!(!Notice::TaintsKept.is_warning() && !g.taints_dropped());
    assert_eq!(g.taints_written(true, true), Some(Notice::TaintsDropped));
    // Taints never withdraw devices.
    assert!(!g.withdrawn());
}

/// A device slice key with the shareable device `gpu-0-1g-0-shared` (`allowMultipleAllocations`,
/// capacities with request policies) beside an exclusive one.
fn shared_slice() -> Value {
    json!({"driver": "dev.example.com", "nodeName": "n0",
           "pool": {"name": "n0", "generation": 0, "resourceSliceCount": 2},
           "devices": [
               {"name": "gpu-0-1g-0", "attributes": {"type": {"string": "mig"}},
                "capacity": {"memory": {"value": "10Gi"}}},
               {"name": "gpu-0-1g-0-shared", "attributes": {"type": {"string": "mig-shared"}},
                "allowMultipleAllocations": true,
                "capacity": {"shares": {"value": "4", "requestPolicy": {"default": "1"}},
                             "memory": {"value": "10Gi", "requestPolicy": {"default": "2560Mi"}}}}]})
}

#[test]
fn dropped_consumable_capacity_is_told_from_other_differences() {
    let sent = shared_slice();
    assert!(carries_shares(&sent) && !carries_shares(&device_slice(true, true)));
    assert_eq!(dropped(&sent, &sent), Dropped::default());
    // DRAConsumableCapacity off: `allowMultipleAllocations` and the request policies go.
    let mut off = sent.clone();
    let shared = off["devices"][1].as_object_mut().unwrap();
    shared.remove("allowMultipleAllocations");
    for cap in ["shares", "memory"] {
        shared["capacity"][cap]
            .as_object_mut()
            .unwrap()
            .remove("requestPolicy");
    }
    assert_eq!(
        dropped(&sent, &off),
        Dropped {
            shares: true,
            ..Dropped::default()
        }
    );
    // Either loss alone counts.
    let mut no_policy = sent.clone();
    no_policy["devices"][1]["capacity"]["memory"]
        .as_object_mut()
        .unwrap()
        .remove("requestPolicy");
    assert!(dropped(&sent, &no_policy).shares);
    let mut single = sent.clone();
    single["devices"][1]["allowMultipleAllocations"] = json!(false);
    assert!(dropped(&sent, &single).shares);
    // Another difference (an attribute canonicalized) is not a drop.
    let mut other = sent.clone();
    other["devices"][0]["attributes"] = json!({});
    assert_eq!(dropped(&sent, &other), Dropped::default());
}

#[test]
fn dropped_consumable_capacity_withdraws_the_shareable_devices_and_warns_once() {
    let mut g = Guard::default();
    assert_eq!(g.shares_written(false), None);
    assert!(!g.shares_dropped());
    let notice = g.shares_written(true).expect("a notice");
    assert_eq!(notice, Notice::SharesDropped);
    assert!(notice.is_warning());
    assert_eq!(
        (notice.gate(), notice.reason()),
        ("DRAConsumableCapacity", "ConsumableCapacityDropped")
    );
    let note = notice.note(&pool());
    for want in [
        "DRAConsumableCapacity",
        "allowMultipleAllocations",
        "kube-apiserver and kube-scheduler",
        "withdrawn",
        "restart",
        "n0",
    ] {
        assert!(note.contains(want), "{want:?} missing from {note:?}");
    }
    assert!(note.chars().count() <= 1000, "fits an event note");
    // For the plugin's life: no second notice, a later write that keeps them changes nothing.
    assert!(g.shares_dropped());
    assert_eq!(g.shares_written(true), None);
    assert_eq!(g.shares_written(false), None);
    assert!(g.shares_dropped());
    // The exclusive devices stay published.
    assert!(!g.withdrawn());
}

#[test]
fn dropped_binding_conditions_are_seen() {
    let sent = json!({"devices": [
        {"name": "gpu-0-mig-1g-5gb-0", "bindingConditions": ["dev.example.com/SliceReady"],
         "bindingFailureConditions": ["dev.example.com/SliceFailed"]},
        {"name": "gpu-1"}
    ]});
    assert!(carries_binding_conditions(&sent));
    assert!(!carries_binding_conditions(
        &json!({"devices": [{"name": "gpu-1"}]})
    ));
    assert_eq!(dropped(&sent, &sent), Dropped::default());
    let stored = json!({"devices": [{"name": "gpu-0-mig-1g-5gb-0"}, {"name": "gpu-1"}]});
    assert_eq!(
        dropped(&sent, &stored),
        Dropped {
            binding: true,
            ..Dropped::default()
        }
    );
    let mut guard = Guard::default();
    assert!(!guard.binding_dropped());
    assert_eq!(guard.binding_written(false), None);
    let notice = guard.binding_written(true).unwrap();
    assert_eq!(notice, Notice::BindingConditionsDropped);
    assert!(notice.is_warning() && notice.gate() == "DRADeviceBindingConditions");
    assert!(notice.note(&pool()).contains("restart the node plugin"));
    assert!(guard.binding_dropped());
    assert_eq!(guard.binding_written(true), None, "told once");
}
