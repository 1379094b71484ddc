//! The publisher against a server that drops binding conditions (`DRADeviceBindingConditions`
//! off): the devices are published again without them at once, and for the publisher's life.

use super::*;

/// The desired specs of one card (counters apart), each device waiting for
/// `dev.example.com/Ready` when `bound`.
fn desired_bound(bound: bool) -> Vec<ResourceSliceSpec> {
    let mut specs = desired(Layout::Apart, false);
    if bound {
        for d in specs
            .iter_mut()
            .flat_map(|s| s.devices.iter_mut().flatten())
        {
            d.binding_conditions = Some(vec!["dev.example.com/Ready".into()]);
            d.binding_failure_conditions = Some(vec!["dev.example.com/Failed".into()]);
        }
    }
    specs
}

fn bound_devices(api: &FakeSliceApi) -> usize {
    api.stored()
        .into_iter()
        .flat_map(|s| s.spec.devices.unwrap_or_default())
        .filter(|d| d.binding_conditions.is_some() || d.binding_failure_conditions.is_some())
        .count()
}

#[tokio::test(start_paused = true)]
async fn dropped_binding_conditions_republish_the_devices_without_them() {
    let (api, told) = fake(true, true);
    let mut p = publisher(&api, &told);
    let want = desired_bound(true);
    p.publish(want.clone()).await.unwrap();
    assert!(!p.withdrawn(), "the devices stay published");
    assert_full(&api, &desired_bound(false));
    assert_eq!(bound_devices(&api), 0);
    let events = told.events();
    assert_eq!(events.len(), 1, "{events:?}");
    let (warning, reason, note) = &events[0];
    assert!(*warning && reason == "BindingConditionsDropped", "{reason}");
    assert!(note.contains("DRADeviceBindingConditions"), "{note}");
    assert_eq!(told.gate_off("DRADeviceBindingConditions"), Some(true));
    // Later publishes leave them out without writing or warning again, even with the gate on.
    api.state().binding_gate = true;
    let stats = p.publish(want).await.unwrap();
    assert_eq!(stats.writes(), 0, "{stats:?}");
    assert_eq!(told.events().len(), 1);
    assert_eq!(bound_devices(&api), 0);
}

#[tokio::test(start_paused = true)]
async fn kept_binding_conditions_are_published() {
    let (api, told) = fake(true, true);
    api.state().binding_gate = true;
    let mut p = publisher(&api, &told);
    let want = desired_bound(true);
    p.publish(want.clone()).await.unwrap();
    assert_full(&api, &want);
    assert!(bound_devices(&api) > 0);
    assert!(told.events().is_empty(), "{:?}", told.events());
    assert_eq!(told.gate_off("DRADeviceBindingConditions"), Some(false));
}
