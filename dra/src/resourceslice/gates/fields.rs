//! The gated fields of a ResourceSlice spec, as the publisher compares what it sent with what
//! the server stored (pure; see [`super`] for what each gate costs).

use std::collections::BTreeSet;

use serde_json::Value;

/// The gated fields one spec carries, from its [`crate::resourceslice::plan::spec_key`] (camelCase JSON, empty
/// lists pruned, so present means non-empty).
#[derive(Debug, Default)]
struct Uses {
    /// `sharedCounters` is set.
    shared_counters: bool,
    /// Names of the devices with `consumesCounters`.
    consuming: BTreeSet<String>,
    /// Names of the devices with `taints`.
    tainted: BTreeSet<String>,
    /// Names of the devices with `allowMultipleAllocations: true`.
    shareable: BTreeSet<String>,
    /// `(device, capacity)` of the capacities with a `requestPolicy`.
    policies: BTreeSet<(String, String)>,
    /// Names of the devices with `bindingConditions` or `bindingFailureConditions`.
    bound: BTreeSet<String>,
}

fn uses(key: &Value) -> Uses {
    let mut u = Uses {
        shared_counters: key.get("sharedCounters").is_some_and(|v| !v.is_null()),
        ..Default::default()
    };
    let devices = key.get("devices").and_then(Value::as_array);
    for device in devices.into_iter().flatten() {
        let name = device
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if device.get("consumesCounters").is_some_and(|v| !v.is_null()) {
            u.consuming.insert(name.clone());
        }
        if device.get("taints").is_some_and(|v| !v.is_null()) {
            u.tainted.insert(name.clone());
        }
        if ["bindingConditions", "bindingFailureConditions"]
            .iter()
            .any(|f| device.get(*f).is_some_and(|v| !v.is_null()))
        {
            u.bound.insert(name.clone());
        }
        if device.get("allowMultipleAllocations") == Some(&Value::Bool(true)) {
            u.shareable.insert(name.clone());
        }
        let capacity = device.get("capacity").and_then(Value::as_object);
        for (cap, value) in capacity.into_iter().flatten() {
            if value.get("requestPolicy").is_some_and(|v| !v.is_null()) {
                u.policies.insert((name.clone(), cap.clone()));
            }
        }
    }
    u
}

/// Whether a spec key carries shared counters (a counter set, or a device consuming one).
pub fn carries_counters(key: &Value) -> bool {
    let u = uses(key);
    u.shared_counters || !u.consuming.is_empty()
}

/// Whether a spec key carries a shareable device (`allowMultipleAllocations`).
pub fn carries_shares(key: &Value) -> bool {
    !uses(key).shareable.is_empty()
}

/// Whether a spec key carries a device with binding conditions.
pub fn carries_binding_conditions(key: &Value) -> bool {
    !uses(key).bound.is_empty()
}

/// Whether a spec key carries device taints.
pub fn carries_taints(key: &Value) -> bool {
    !uses(key).tainted.is_empty()
}

/// What the server dropped of one written spec, among the fields whose loss the guard acts on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Dropped {
    /// `sharedCounters` was sent and not stored, or a device's `consumesCounters` was
    /// ([`super::PARTITIONABLE_DEVICES`] off).
    pub counters: bool,
    /// A device's `taints` were sent and not stored ([`super::DEVICE_TAINTS`] off).
    pub taints: bool,
    /// A device's `allowMultipleAllocations`, or a capacity's `requestPolicy`, was sent and not
    /// stored ([`super::CONSUMABLE_CAPACITY`] off).
    pub shares: bool,
    /// A device's `bindingConditions` or `bindingFailureConditions` were sent and not stored
    /// ([`super::DEVICE_BINDING_CONDITIONS`] off).
    pub binding: bool,
}

/// Compares the keys ([`crate::resourceslice::plan::spec_key`]) of a sent spec and of what the server stored
/// (or, for a dry run, would store). Devices are matched by name.
pub fn dropped(sent: &Value, stored: &Value) -> Dropped {
    let (s, t) = (uses(sent), uses(stored));
    Dropped {
        counters: (s.shared_counters && !t.shared_counters) || !s.consuming.is_subset(&t.consuming),
        taints: !s.tainted.is_subset(&t.tainted),
        shares: !s.shareable.is_subset(&t.shareable) || !s.policies.is_subset(&t.policies),
        binding: !s.bound.is_subset(&t.bound),
    }
}
