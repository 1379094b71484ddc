use super::*;

#[test]
fn errors_are_counted_by_cause_and_other_outcomes_have_no_cause_label() {
    let m = Metrics::default();
    m.count("patched");
    m.count_error("list_classes");
    m.count_error("list_classes");
    let text = m.encode();
    for want in [
        "das_webhook_admission_requests_total{outcome=\"patched\"} 1",
        "das_webhook_admission_requests_total{outcome=\"error\",cause=\"list_classes\"} 2",
    ] {
        assert!(text.contains(want), "{want} missing in\n{text}");
    }
}
