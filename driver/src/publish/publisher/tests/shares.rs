//! The publisher against a server that drops consumable capacity (`DRAConsumableCapacity`
//! off): the shareable devices are withdrawn at once and for good, the rest stays published.

use super::*;
use crate::publish::resource_slices::{SharePolicy, SharedProfiles, SliceOptions};

/// The desired specs of one A100-40GB on `n0` (1.35+ layout) with the 1g profiles shared.
fn desired_shared(shared: bool) -> Vec<ResourceSliceSpec> {
    let gpu = GpuInfo::for_tests(0, "A100-SXM4-40GB");
    let options = SliceOptions {
        layout: ResourceSliceLayout::SeparateCounterSlices,
        shared: SharedProfiles {
            selectors: if shared { vec!["1g".into()] } else { vec![] },
            policy: SharePolicy::default(),
            ..Default::default()
        },
    };
    desired_resource_slices("n0", &[gpu], options)
        .unwrap()
        .into_iter()
        .map(|d| d.slice.spec)
        .collect()
}

fn stored_devices(api: &FakeApi) -> Vec<Device> {
    api.stored()
        .into_iter()
        .flat_map(|s| s.spec.devices.unwrap_or_default())
        .collect()
}

#[tokio::test(start_paused = true)]
async fn dropped_consumable_capacity_withdraws_the_shareable_devices_only() {
    let api = FakeApi::new(true, true);
    let metrics = Arc::new(Metrics::new());
    let mut p = publisher(&api, &metrics);
    let want = desired_shared(true);
    p.publish(want.clone()).await.unwrap();
    assert!(!p.withdrawn(), "the exclusive devices stay published");
    let stored = stored_devices(&api);
    assert!(
        !stored.iter().any(|d| d.name.ends_with("-shared")),
        "no shareable device is left stored: {:?}",
        stored.iter().map(|d| &d.name).collect::<Vec<_>>()
    );
    assert_full(&api, &desired_shared(false));
    let events = api.events();
    assert_eq!(events.len(), 1, "{events:?}");
    let (warning, reason, note) = &events[0];
    assert!(
        *warning && reason == "ConsumableCapacityDropped",
        "{reason}"
    );
    assert!(note.contains("DRAConsumableCapacity"), "{note}");
    assert_eq!(
        gauge(&metrics, "DRAConsumableCapacity").as_deref(),
        Some("1")
    );
    // Later publishes leave them out without writing or warning again, even with the gate on.
    api.state().shares_gate = true;
    let stats = p.publish(want).await.unwrap();
    assert_eq!(stats.writes(), 0, "{stats:?}");
    assert_eq!(api.events().len(), 1);
    assert!(
        !stored_devices(&api)
            .iter()
            .any(|d| d.name.ends_with("-shared"))
    );
}

#[tokio::test(start_paused = true)]
async fn kept_consumable_capacity_publishes_the_shareable_devices() {
    let api = FakeApi::new(true, true);
    api.state().shares_gate = true;
    let metrics = Arc::new(Metrics::new());
    let mut p = publisher(&api, &metrics);
    let want = desired_shared(true);
    p.publish(want.clone()).await.unwrap();
    let stored = stored_devices(&api);
    let shared: Vec<&Device> = stored
        .iter()
        .filter(|d| d.name.ends_with("-shared"))
        .collect();
    assert!(!shared.is_empty());
    assert!(
        shared
            .iter()
            .all(|d| d.allow_multiple_allocations == Some(true))
    );
    assert_full(&api, &want);
    assert!(api.events().is_empty(), "{:?}", api.events());
    assert_eq!(
        gauge(&metrics, "DRAConsumableCapacity").as_deref(),
        Some("0")
    );
}
