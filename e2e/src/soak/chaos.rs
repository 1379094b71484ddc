//! The chaos task: SIGKILL and restart of node plugins, the controller, the webhook and hollow
//! kubelets, and emulated-GPU faults through the plugins' control files (a failed MIG mode
//! switch on the node whose GPUs switch, [`super::SWITCHING_NODE`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use super::{Run, SoakConfig};
use crate::cluster::{Cluster, NodeInfo};
use crate::das::write_control;

/// The chaos task: one action every interval, until the phase's cycles end (dropped then).
pub(super) async fn chaos(
    run: &Arc<Run>,
    cfg: &SoakConfig,
    cluster: &mut Cluster,
    nodes: &[NodeInfo],
    seed: u64,
    last: &std::sync::Mutex<Instant>,
) -> Result<()> {
    let Some((lo, hi)) = cfg.chaos else {
        std::future::pending::<()>().await;
        return Ok(());
    };
    let mut rng = StdRng::seed_from_u64(seed);
    loop {
        let wait = rng.random_range(lo.as_millis() as u64..=hi.as_millis() as u64);
        tokio::time::sleep(Duration::from_millis(wait)).await;
        let node = &nodes[rng.random_range(0..nodes.len())];
        let action = rng.random_range(0..11);
        let what: String = match action {
            0 | 1 => {
                let name = format!("das-plugin-{}", node.name);
                cluster.crash_and_restart(&name)?;
                name
            }
            2 => {
                cluster.crash_and_restart("das-controller")?;
                "das-controller".into()
            }
            3 => {
                cluster.crash_and_restart("das-webhook")?;
                "das-webhook".into()
            }
            4 => {
                let name = format!("kubelet-{}", node.name);
                cluster.crash_and_restart(&name)?;
                name
            }
            10 => {
                if switch_fault(run, nodes, &mut rng).await? {
                    *last.lock().expect("last chaos") = Instant::now();
                }
                continue;
            }
            _ => {
                gpu_fault(run, node, action, &mut rng).await?;
                *last.lock().expect("last chaos") = Instant::now();
                continue;
            }
        };
        tracing::info!(component = %what, "soak: SIGKILL and restart");
        *run.report.lock().await.kills.entry(what).or_default() += 1;
        *last.lock().expect("last chaos") = Instant::now();
    }
}

/// The next switch of one of the switching node's GPUs fails: the prepare that needed it fails
/// and the GPU serves its current mode only until the plugin restarts. `false` without that
/// node.
async fn switch_fault(run: &Arc<Run>, nodes: &[NodeInfo], rng: &mut StdRng) -> Result<bool> {
    let Some(node) = nodes.iter().find(|n| n.name == super::SWITCHING_NODE) else {
        return Ok(false);
    };
    let kind = if rng.random_bool(0.5) {
        "InUse"
    } else {
        "ResetRequired"
    };
    let gpu = rng.random_range(0..2);
    let control = json!({"setMigModeFaults": [{"gpu": gpu, "count": 1, "kind": kind}]});
    write_control(node, &control)?;
    run.switch_faults
        .store(true, std::sync::atomic::Ordering::SeqCst);
    *run.report
        .lock()
        .await
        .faults
        .entry("MIG mode switch failure")
        .or_default() += 1;
    Ok(true)
}

/// Emulated-GPU fault `action` (5 to 9) on one of `node`'s GPUs; latency and a lost GPU last a
/// few seconds, then the GPU is back.
async fn gpu_fault(run: &Arc<Run>, node: &NodeInfo, action: u32, rng: &mut StdRng) -> Result<()> {
    let gpu = rng.random_range(0..2);
    let (kind, control): (&'static str, Value) = match action {
        5 => (
            "IN_USE on destroy",
            json!({"destroyFaults": [{"gpu": gpu, "count": rng.random_range(1..6), "kind": "InUse"}]}),
        ),
        6 => (
            "create failure",
            json!({"createFaults": [{"gpu": gpu, "count": 1, "kind": "Other"}]}),
        ),
        7 => (
            "destroy failure",
            json!({"destroyFaults": [{"gpu": gpu, "count": 1, "kind": "Other"}]}),
        ),
        8 => (
            "latency",
            json!({"latencyMs": {"create": 1500, "destroy": 500}}),
        ),
        _ => ("GPU lost and back", json!({"lostGpus": [gpu]})),
    };
    write_control(node, &control)?;
    *run.report.lock().await.faults.entry(kind).or_default() += 1;
    if matches!(action, 8 | 9) {
        tokio::time::sleep(Duration::from_secs(rng.random_range(2..6))).await;
        write_control(node, &json!({}))?;
    }
    Ok(())
}
