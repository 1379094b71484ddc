//! The publisher against a server that drops consumable capacity (`DRAConsumableCapacity`
//! off): the shareable devices are withdrawn at once and for good, the rest stays published.

use super::*;
use k8s_openapi::api::resource::v1::Device;

/// A shareable device on parts `[start, start + size)`, marked by `allowMultipleAllocations`
/// and by its attribute `kind: shared`.
fn shareable(name: &str, start: usize, size: usize) -> Value {
    let mut d = device(name, start, size);
    d["allowMultipleAllocations"] = json!(true);
    d["attributes"] = json!({"kind": {"string": "shared"}});
    d["capacity"] = json!({"shares": {"value": "4", "requestPolicy": {"default": "1"}}});
    d
}

/// The desired specs of one card (counters apart) with a shareable device per part, when
/// `shared`.
fn desired_shared(shared: bool) -> Vec<ResourceSliceSpec> {
    let extra = if shared {
        (0..4)
            .map(|p| shareable(&format!("one-{p}-shared"), p, 1))
            .collect()
    } else {
        vec![]
    };
    desired_with(Layout::Apart, extra)
}

fn stored_devices(api: &FakeSliceApi) -> Vec<Device> {
    api.stored()
        .into_iter()
        .flat_map(|s| s.spec.devices.unwrap_or_default())
        .collect()
}

fn any_shared(api: &FakeSliceApi) -> bool {
    stored_devices(api)
        .iter()
        .any(|d| d.name.ends_with("-shared"))
}

#[tokio::test(start_paused = true)]
async fn dropped_consumable_capacity_withdraws_the_shareable_devices_only() {
    let (api, told) = fake(true, true);
    let mut p = publisher(&api, &told);
    let want = desired_shared(true);
    p.publish(want.clone()).await.unwrap();
    assert!(!p.withdrawn(), "the other devices stay published");
    assert!(!any_shared(&api), "no shareable device is left stored");
    assert_full(&api, &desired_shared(false));
    let events = told.events();
    assert_eq!(events.len(), 1, "{events:?}");
    let (warning, reason, note) = &events[0];
    assert!(
        *warning && reason == "ConsumableCapacityDropped",
        "{reason}"
    );
    assert!(note.contains("DRAConsumableCapacity"), "{note}");
    assert_eq!(told.gate_off("DRAConsumableCapacity"), Some(true));
    // Later publishes leave them out without writing or warning again, even with the gate on.
    api.state().shares_gate = true;
    let stats = p.publish(want).await.unwrap();
    assert_eq!(stats.writes(), 0, "{stats:?}");
    assert_eq!(told.events().len(), 1);
    assert!(!any_shared(&api));
}

#[tokio::test(start_paused = true)]
async fn kept_consumable_capacity_publishes_the_shareable_devices() {
    let (api, told) = fake(true, true);
    api.state().shares_gate = true;
    let mut p = publisher(&api, &told);
    let want = desired_shared(true);
    p.publish(want.clone()).await.unwrap();
    let stored = stored_devices(&api);
    let shared: Vec<&Device> = stored
        .iter()
        .filter(|d| d.name.ends_with("-shared"))
        .collect();
    assert_eq!(shared.len(), 4);
    assert!(
        shared
            .iter()
            .all(|d| d.allow_multiple_allocations == Some(true))
    );
    assert_full(&api, &want);
    assert!(told.events().is_empty(), "{:?}", told.events());
    assert_eq!(told.gate_off("DRAConsumableCapacity"), Some(false));
}

#[tokio::test(start_paused = true)]
async fn the_driver_may_say_which_devices_are_shareable() {
    // A driver that marks its shareable devices by an attribute leaves them out, whatever
    // their `allowMultipleAllocations` says.
    let by_kind: Shareable = |d| {
        d.attributes
            .as_ref()
            .and_then(|a| a.get("kind"))
            .and_then(|k| k.string.as_deref())
            == Some("shared")
    };
    let (api, told) = fake(true, true);
    let mut p = publisher(&api, &told).with_shareable(by_kind);
    let mut want = desired_shared(true);
    // One shareable device loses its flag in the driver's own slices: still shareable.
    let unflagged = want[1]
        .devices
        .as_mut()
        .unwrap()
        .iter_mut()
        .find(|d| d.name == "one-0-shared")
        .unwrap();
    unflagged.allow_multiple_allocations = None;
    p.publish(want).await.unwrap();
    assert!(!any_shared(&api), "{:?}", stored_devices(&api));
    assert_full(&api, &desired_shared(false));
}
