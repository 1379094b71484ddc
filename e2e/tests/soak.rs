//! The chaos soak, short: 40 pod cycles on the local cluster with kills and GPU faults every
//! few seconds, then the invariants (`das_e2e::soak::check_invariants`). `make soak` runs the
//! long one (≥ 500 cycles).

use std::time::Duration;

use das_e2e::soak::{self, SoakConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_soak_with_kills_and_faults_keeps_every_invariant() {
    let cfg = SoakConfig {
        seed: 7,
        cycles: 40,
        concurrency: 4,
        phases: 1,
        chaos: Some((Duration::from_secs(2), Duration::from_secs(4))),
        binaries: soak::binaries("debug").expect("DAS binaries (make e2e builds them)"),
        converge_limit: Duration::from_secs(150),
    };
    let report = soak::run(&cfg).await.expect("the soak runs");
    eprintln!("{}", report.markdown(&cfg));
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
    assert!(report.total_cycles() >= 40, "{report:?}");
    assert!(
        report.kills.values().sum::<usize>() + report.faults.values().sum::<usize>() >= 3,
        "chaos happened: {report:?}"
    );
    assert!(!report.create_to_running.is_empty(), "pods ran: {report:?}");
}

/// The invariant checks can fail: a slice DAS created that no claim holds (a leak), a CDI spec of
/// a claim that is gone, and a slice on a GPU whose MIG mode is off are all reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_invariant_checks_catch_a_leaked_slice_and_a_stale_cdi_spec() {
    let (mut cluster, nodes) = soak::start(&soak::binaries("debug").expect("DAS binaries"))
        .await
        .expect("cluster");
    let client = cluster.client();
    let clean = soak::check_invariants(&client, &nodes).await.unwrap();
    assert!(clean.is_empty(), "{clean:?}");
    // Leak: the plugin is stopped and a DAS-created instance appears in its GPU state.
    cluster.stop_component("das-plugin-n1", true).unwrap();
    let dirs = das_e2e::das::PluginDirs::of(&nodes[1]);
    let state_path = dirs.state.join("emulated/emulated-gpus.json");
    let mut state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&state_path).unwrap()).unwrap();
    state["gpus"][0]["instances"] = serde_json::json!([{
        "giId": 1, "ciId": 0, "profile": "1g.10gb", "start": 3,
        "migUuid": "MIG-00000000-0000-0000-0000-00000000beef", "createdByDas": true
    }]);
    state["gpus"][0]["migEnabled"] = serde_json::json!(false);
    std::fs::write(&state_path, serde_json::to_vec(&state).unwrap()).unwrap();
    std::fs::write(
        dirs.cdi.join("das.com-mig_0badc0de-0000-4000-8000-000000000000.json"),
        r#"{"cdiVersion":"0.5.0","kind":"das.com/mig","devices":[{"name":"0badc0de-0000-4000-8000-000000000000-gpu-0-mig-1g-10gb-3","containerEdits":{"env":["A=B"]}}]}"#,
    )
    .unwrap();
    let found = soak::check_invariants(&client, &nodes).await.unwrap();
    assert!(
        found
            .iter()
            .any(|v| v.starts_with("1: n1: live slice MIG-00000000-0000-0000-0000-00000000beef")),
        "{found:?}"
    );
    assert!(
        found
            .iter()
            .any(|v| v.starts_with("6: n1: CDI spec of claim 0badc0de")),
        "{found:?}"
    );
    assert!(
        found
            .iter()
            .any(|v| v.starts_with("9: n1: GPU 0 has MIG mode off with 1 slice(s)")),
        "{found:?}"
    );
}
