use super::*;

#[test]
fn metrics_are_exposed_with_labels() {
    let m = Metrics::new();
    m.reconciled(true);
    m.reconciled(false);
    m.reconcile_error("apply");
    m.wrote("apply");
    m.set_claims(&[(AllocationState::InUse, 2)]);
    let text = m.probe.encode();
    for want in [
        "das_controller_reconciles_total{result=\"ok\"} 1",
        "das_controller_errors_total{cause=\"apply\"} 1",
        "das_controller_writes_total{op=\"apply\"} 1",
        "das_controller_allocation_claims{state=\"inUse\"} 2",
        "das_controller_allocation_claims{state=\"staged\"} 0",
    ] {
        assert!(text.contains(want), "{want} missing in\n{text}");
    }
}

#[test]
fn device_info_rows_come_from_the_source_given_on_each_scrape() {
    let m = Metrics::new();
    let text = m.probe.encode();
    assert!(
        text.contains(&format!("# TYPE {DEVICE_INFO} gauge")),
        "{text}"
    );
    assert!(
        !text.contains(&format!("{DEVICE_INFO}{{")),
        "no rows before a source"
    );
    m.export_device_info(|| vec![vec![("pod".to_string(), "p".to_string())]]);
    let text = m.probe.encode();
    assert!(
        text.contains(&format!("{DEVICE_INFO}{{pod=\"p\"}} 1")),
        "{text}"
    );
}
