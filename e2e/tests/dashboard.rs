//! The Grafana dashboard in deploy/grafana/ parses, and every query it makes names a metric DAS
//! exports (from the components' own registries) or one dcgm-exporter exports by default. A
//! renamed metric fails here instead of leaving an empty panel. No cluster needed.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::Value;

/// dcgm-exporter metrics the dashboard may join with: fields of its default counter set
/// (`etc/default-counters.csv` in NVIDIA/dcgm-exporter), reported per MIG device with the
/// `UUID` and `GPU_I_ID` labels.
const DCGM_METRICS: &[&str] = &["DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_DEV_FB_USED"];

fn dashboard() -> Value {
    let path = das_e2e::cluster::workspace_root().join("deploy/grafana/das-dashboard.json");
    let text = std::fs::read_to_string(&path).expect("the dashboard exists");
    serde_json::from_str(&text).expect("the dashboard is JSON")
}

/// Every sample name the components export: gauges as registered, counters with `_total`,
/// histograms with `_bucket`, `_sum` and `_count` (from the `# TYPE` lines of their OpenMetrics
/// text). A labelled family shows only once it has a sample, so each recording method is called
/// once first.
fn exported() -> BTreeSet<String> {
    let plugin = das_driver::metrics::Metrics::new();
    let took = Duration::from_millis(3);
    plugin.observe_call("prepare", None, took);
    plugin.observe_call("prepare", Some("create"), took);
    plugin.observe_backend("create", took);
    plugin.set_prepared([(0, 1, 2)]);
    plugin.set_gpu_healthy(0, true);
    plugin.set_free_placements(0, &[("1g.10gb".into(), 7)]);
    plugin.xid_seen(0, 79, true);
    plugin.status_write_failed();
    plugin.destroy_failed("in_use");
    plugin.reaper_attempt(true);
    plugin.placement_wait("released", took);
    plugin.set_pending_destroy(0);
    let controller = das_controller::metrics::Metrics::new();
    controller.reconciled(false);
    controller.reconcile_error("apply");
    controller.lease_error("lease");
    controller.wrote("apply");
    controller.set_claims(&[]);
    controller.in_use_lag.observe(0.1);
    let webhook = das_webhook::metrics::Metrics::default();
    webhook.count("patched");
    webhook.count_error("list_classes");
    let texts = [
        plugin.probe.encode(),
        controller.probe.encode(),
        webhook.encode(),
    ];
    let mut names = BTreeSet::new();
    for line in texts.iter().flat_map(|t| t.lines()) {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut parts = rest.split_whitespace();
        let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
            continue;
        };
        match kind {
            "counter" => {
                names.insert(format!("{name}_total"));
            }
            "histogram" => {
                for suffix in ["_bucket", "_sum", "_count"] {
                    names.insert(format!("{name}{suffix}"));
                }
            }
            _ => {
                names.insert(name.to_string());
            }
        }
    }
    names
}

/// Every panel, rows' nested panels included.
fn panels(d: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in d["panels"].as_array().into_iter().flatten() {
        out.push(p);
        out.extend(p["panels"].as_array().into_iter().flatten());
    }
    out
}

/// Metric-like identifiers in a PromQL expression: tokens starting `das_` or `DCGM_`.
fn metric_names(expr: &str) -> Vec<&str> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|t| t.starts_with("das_") || t.starts_with("DCGM_"))
        .collect()
}

#[test]
fn every_dashboard_query_names_an_exported_metric() {
    let d = dashboard();
    let exported = exported();
    assert!(
        exported.contains("das_mig_device_info")
            && exported.contains("das_kubelet_plugin_gpu_healthy"),
        "{exported:?}"
    );
    let panels = panels(&d);
    assert!(!panels.is_empty());
    let mut ids = BTreeSet::new();
    let mut joins = 0;
    for p in &panels {
        let title = p["title"].as_str().unwrap_or("?");
        assert!(
            ids.insert(p["id"].as_i64().unwrap()),
            "duplicate id: {title}"
        );
        let targets = p["targets"].as_array().unwrap_or_else(|| panic!("{title}"));
        assert!(!targets.is_empty(), "{title} has no query");
        for t in targets {
            let expr = t["expr"]
                .as_str()
                .unwrap_or_else(|| panic!("{title}: no expr"));
            let names = metric_names(expr);
            assert!(
                names.iter().any(|n| n.starts_with("das_")),
                "{title}: {expr} names no DAS metric"
            );
            for n in names {
                assert!(
                    exported.contains(n) || DCGM_METRICS.contains(&n),
                    "{title}: {n} is not exported (exported: {exported:?})"
                );
            }
            if expr.contains("DCGM_") {
                joins += 1;
                for label in ["gpu_uuid", "gpu_instance_id", "UUID", "GPU_I_ID"] {
                    assert!(expr.contains(label), "{title}: the DCGM join uses {label}");
                }
            }
        }
    }
    assert!(joins > 0, "a panel joins DCGM with das_mig_device_info");
    let datasource = &d["templating"]["list"][0];
    assert_eq!(datasource["type"], "datasource");
    assert_eq!(datasource["query"], "prometheus");
}

#[test]
fn the_docs_show_the_join_the_dashboard_uses() {
    let ops =
        std::fs::read_to_string(das_e2e::cluster::workspace_root().join("docs/operations.md"))
            .unwrap();
    assert!(
        ops.contains("group_left DCGM_FI_PROF_GR_ENGINE_ACTIVE")
            && ops.contains("deploy/grafana/das-dashboard.json"),
        "docs/operations.md shows the DCGM join and names the dashboard"
    );
}
