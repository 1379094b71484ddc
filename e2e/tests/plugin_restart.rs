//! The plugin crashes (SIGKILL) and restarts while pods run: no slice is lost or duplicated and
//! new pods still prepare. A slice DAS created but no claim owns (an orphan) is destroyed at the
//! next start.

use anyhow::{Context, Result, ensure};
use das_e2e::Cluster;
use das_e2e::das::PluginDirs;
use das_e2e::plugin::{cluster_with_plugins, live_slices, plugin_name, start_plugin};
use das_e2e::wait::{self, TIMEOUT};
use das_e2e::workload::{create_pod, create_template, delete_pod, wait_running};

const NODE: &str = "n0";
const GPUS: &str = "H100-80GB:1";

#[tokio::test]
async fn crash_restart_keeps_slices_and_destroys_orphans() {
    let (mut cluster, _) = cluster_with_plugins(&[(NODE, GPUS)]).await;
    let r = scenario(&mut cluster).await;
    cluster.check(r);
}

async fn scenario(cluster: &mut Cluster) -> Result<()> {
    let c = cluster.client();
    create_template(&c, "one-1g", "1g.10gb", 1).await?;
    create_pod(&c, "a", "one-1g", None).await?;
    wait_running(&c, "a").await?;
    let before = live_slices(cluster, NODE)?;
    ensure!(before.len() == 1);

    // Crash, then a new pod arrives while the plugin is down; the plugin comes back.
    cluster.stop_component(&plugin_name(NODE), false)?;
    create_pod(&c, "b", "one-1g", None).await?;
    start_plugin(cluster, NODE, GPUS)?;
    wait_running(&c, "b").await?;
    let after = live_slices(cluster, NODE)?;
    ensure!(
        after.len() == 2,
        "a's slice kept, b's created, nothing duplicated: {after:?}"
    );
    ensure!(
        after.iter().any(|s| s.3 == before[0].3),
        "a's slice survived the crash: {after:?}"
    );

    // An orphan: a slice in the GPU's state that no claim holds (as if a prepare had crashed
    // after creating it and the checkpoint were lost).
    cluster.stop_component(&plugin_name(NODE), false)?;
    let orphan = inject_orphan(cluster)?;
    start_plugin(cluster, NODE, GPUS)?;
    wait::until("the orphaned slice to be destroyed", TIMEOUT, || async {
        Ok((!live_slices(cluster, NODE)?.iter().any(|s| s.3 == orphan)).then_some(()))
    })
    .await?;
    ensure!(
        live_slices(cluster, NODE)?.len() == 2,
        "claimed slices stay: {:?}",
        live_slices(cluster, NODE)?
    );

    // A corrupt checkpoint is moved aside and rebuilt from the GPUs and the API server: the
    // running pods keep their slices, and unprepare still finds them later.
    cluster.stop_component(&plugin_name(NODE), false)?;
    let cp = PluginDirs::of(cluster.node(NODE))
        .state
        .join("checkpoint.json");
    std::fs::write(&cp, b"{ this is not a checkpoint")?;
    start_plugin(cluster, NODE, GPUS)?;
    wait::until("a fresh checkpoint", TIMEOUT, || async {
        let text = std::fs::read_to_string(&cp).unwrap_or_default();
        Ok(text.contains("PrepareCompleted").then_some(()))
    })
    .await?;
    let state = PluginDirs::of(cluster.node(NODE)).state;
    let moved_aside = std::fs::read_dir(&state)?
        .filter_map(|e| e.ok())
        .any(|e| e.file_name().to_string_lossy().contains(".corrupt-"));
    ensure!(
        moved_aside,
        "the corrupt checkpoint is kept aside for inspection"
    );
    let kept = live_slices(cluster, NODE)?;
    ensure!(kept.len() == 2, "rebuilt, not destroyed: {kept:?}");

    // New pods still prepare after all that.
    create_pod(&c, "c", "one-1g", None).await?;
    wait_running(&c, "c").await?;
    for p in ["a", "b", "c"] {
        delete_pod(&c, p).await?;
    }
    wait::until("every slice to be destroyed", TIMEOUT, || async {
        Ok(live_slices(cluster, NODE)?.is_empty().then_some(()))
    })
    .await
}

/// Adds a `1g.10gb` instance at the lowest free memory slice to the emulated state file.
fn inject_orphan(cluster: &Cluster) -> Result<String> {
    let path = PluginDirs::of(cluster.node(NODE))
        .state
        .join("emulated")
        .join("emulated-gpus.json");
    let mut state: serde_json::Value = serde_json::from_slice(&std::fs::read(&path)?)?;
    let gpu = &mut state["gpus"][0];
    let used: Vec<u64> = gpu["instances"]
        .as_array()
        .context("instances")?
        .iter()
        .filter_map(|i| i["start"].as_u64())
        .collect();
    let start = (0..7)
        .find(|s| !used.contains(s))
        .context("a free memory slice")?;
    let gi = gpu["instances"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i["giId"].as_u64())
        .max()
        .map_or(1, |m| m + 1);
    let uuid = "MIG-00000000-dead-beef-0000-000000000001".to_string();
    gpu["instances"].as_array_mut().unwrap().push(serde_json::json!({
        "giId": gi, "ciId": 0, "profile": "1g.10gb", "start": start, "migUuid": uuid, "createdByDas": true
    }));
    std::fs::write(&path, serde_json::to_vec_pretty(&state)?)?;
    Ok(uuid)
}
