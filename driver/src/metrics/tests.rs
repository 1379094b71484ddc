//! Unit tests of [`super`] (`metrics.rs`).

use super::*;

#[test]
fn metrics_are_exposed_with_labels() {
    let m = Metrics::new();
    m.observe_call("prepare", None, Duration::from_millis(3));
    m.observe_call("prepare", Some("not_allocated"), Duration::from_millis(3));
    m.set_prepared([(0, 2, 3), (1, 1, 1)]);
    m.set_prepared([(1, 1, 2)]);
    m.set_gpu_healthy(1, false);
    m.set_free_placements(2, &[("7g.40gb".into(), 0), ("1g.5gb".into(), 6)]);
    m.xid_seen(1, 79, true);
    m.set_feature_gate_off("DRAPartitionableDevices", true);
    m.set_feature_gate_off("DRADeviceTaints", false);
    m.set_node_setup_warning("nvidia_uvm", true);
    m.set_node_setup_warning("visible_devices_envvar", false);
    m.set_mps_daemons(2);
    m.mps_daemon_up(true);
    m.mps_daemon_restarted(true);
    let text = m.probe.encode();
    assert!(
        text.contains(r#"das_kubelet_plugin_requests_total{method="prepare",result="success"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"das_kubelet_plugin_requests_total{method="prepare",result="error"} 1"#)
    );
    assert!(text.contains(r#"das_kubelet_plugin_prepared_slices{gpu="1"} 1"#));
    assert!(
        text.contains(
            r#"das_kubelet_plugin_request_errors_total{method="prepare",cause="not_allocated"} 1"#
        ),
        "{text}"
    );
    assert!(!text.contains(r#"gpu="0""#), "cleared GPUs disappear");
    for want in [
        r#"das_kubelet_plugin_gpu_memory_slices_in_use{gpu="1"} 2"#,
        r#"das_kubelet_plugin_gpu_healthy{gpu="1"} 0"#,
        r#"das_kubelet_plugin_free_placements{gpu="2",profile="7g.40gb"} 0"#,
        r#"das_kubelet_plugin_free_placements{gpu="2",profile="1g.5gb"} 6"#,
        r#"das_kubelet_plugin_xid_events_total{gpu="1",xid="79",fatal="true"} 1"#,
        r#"das_kubelet_plugin_apiserver_feature_gate_off{gate="DRAPartitionableDevices"} 1"#,
        r#"das_kubelet_plugin_apiserver_feature_gate_off{gate="DRADeviceTaints"} 0"#,
        r#"das_kubelet_plugin_node_setup_warning{check="nvidia_uvm"} 1"#,
        r#"das_kubelet_plugin_node_setup_warning{check="visible_devices_envvar"} 0"#,
        "das_kubelet_plugin_mps_daemons 2",
        "das_kubelet_plugin_mps_daemons_up 1",
        r#"das_kubelet_plugin_mps_daemon_restarts_total{result="ok"} 1"#,
    ] {
        assert!(text.contains(want), "{want} missing:\n{text}");
    }
}
