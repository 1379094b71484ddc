//! The publisher against a server that drops binding conditions (`DRADeviceBindingConditions`
//! off; carve before bind): the devices are published again without them at once, and for the
//! plugin's life.

use super::*;
use crate::publish::binding::with_binding_conditions;

/// The desired specs of one A100-40GB on `n0` (1.35+ layout), with binding conditions or not.
fn desired(bound: bool) -> Vec<ResourceSliceSpec> {
    let gpu = GpuInfo::for_tests(0, "A100-SXM4-40GB");
    let slices =
        desired_resource_slices("n0", &[gpu], ResourceSliceLayout::SeparateCounterSlices).unwrap();
    let slices = if bound {
        with_binding_conditions(slices)
    } else {
        slices
    };
    slices.into_iter().map(|d| d.slice.spec).collect()
}

fn bound_devices(api: &FakeApi) -> usize {
    api.stored()
        .into_iter()
        .flat_map(|s| s.spec.devices.unwrap_or_default())
        .filter(|d| d.binding_conditions.is_some() || d.binding_failure_conditions.is_some())
        .count()
}

#[tokio::test(start_paused = true)]
async fn dropped_binding_conditions_republish_the_devices_without_them() {
    let api = FakeApi::new(true, true);
    let metrics = Arc::new(Metrics::new());
    let mut p = publisher(&api, &metrics);
    let want = desired(true);
    p.publish(want.clone()).await.unwrap();
    assert!(!p.withdrawn(), "the devices stay published");
    assert_full(&api, &desired(false));
    assert_eq!(bound_devices(&api), 0);
    let events = api.events();
    assert_eq!(events.len(), 1, "{events:?}");
    let (warning, reason, note) = &events[0];
    assert!(*warning && reason == "BindingConditionsDropped", "{reason}");
    assert!(note.contains("DRADeviceBindingConditions"), "{note}");
    assert_eq!(
        gauge(&metrics, "DRADeviceBindingConditions").as_deref(),
        Some("1")
    );
    // Later publishes leave them out without writing or warning again, even with the gate on.
    api.state().binding_gate = true;
    let stats = p.publish(want).await.unwrap();
    assert_eq!(stats.writes(), 0, "{stats:?}");
    assert_eq!(api.events().len(), 1);
    assert_eq!(bound_devices(&api), 0);
}

#[tokio::test(start_paused = true)]
async fn kept_binding_conditions_are_published() {
    let api = FakeApi::new(true, true);
    api.state().binding_gate = true;
    let metrics = Arc::new(Metrics::new());
    let mut p = publisher(&api, &metrics);
    let want = desired(true);
    p.publish(want.clone()).await.unwrap();
    assert_full(&api, &want);
    assert!(bound_devices(&api) > 0);
    assert!(api.events().is_empty(), "{:?}", api.events());
    assert_eq!(
        gauge(&metrics, "DRADeviceBindingConditions").as_deref(),
        Some("0")
    );
}
