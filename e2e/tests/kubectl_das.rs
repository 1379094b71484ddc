//! `kubectl das` (the `kubectl-das` binary, debug build) against the local cluster: run as a
//! kubectl plugin and on its own, its output checked against the AllocationClaims the controller
//! keeps, and its errors before DAS is installed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};
use das_api::allocation::AllocationClaim;
use das_e2e::cluster::{Cluster, ClusterConfig, workspace_root};
use das_e2e::install::{self, Binaries};
use das_e2e::wait;
use das_e2e::workload::{NS, create_pod, create_template, delete_pods, wait_running};
use kube::Api;
use kube::api::ListParams;
use serde_json::Value;

const NODE: &str = "n0";

fn kubectl_das_bin() -> Result<PathBuf> {
    let bin = install::target_dir().join("debug/kubectl-das");
    ensure!(
        bin.exists(),
        "{} missing: run `cargo build -p kubectl-das` (`make e2e` builds it)",
        bin.display()
    );
    Ok(bin)
}

/// Runs `kubectl-das <args>` with `kubeconfig`; (success, stdout, stderr).
fn kubectl_das(kubeconfig: &Path, args: &[&str]) -> Result<(bool, String, String)> {
    let out = Command::new(kubectl_das_bin()?)
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(args)
        .output()?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    ))
}

/// `kubectl-das <args>` that must succeed; its stdout.
fn ok(kubeconfig: &Path, args: &[&str]) -> Result<String> {
    let (success, out, err) = kubectl_das(kubeconfig, args)?;
    if !success {
        bail!("kubectl-das {args:?} failed: {err}");
    }
    Ok(out)
}

#[tokio::test]
async fn kubectl_das_shows_what_the_allocation_claims_say() {
    let bins = Binaries::in_target_dir("debug", false).expect("DAS binaries");
    let mut cluster = Cluster::start(ClusterConfig::with_nodes(&[NODE]))
        .await
        .expect("cluster starts");
    let r = before_install(&cluster);
    cluster.check(r);
    let gpus = [(NODE.to_string(), "H100-80GB:2".to_string())];
    let r = install::install(&mut cluster, &gpus, &bins).await;
    cluster.check(r.map(|_| ()));
    let r = with_slices(&cluster).await;
    cluster.check(r);
    cluster.stop();
}

/// Before DAS is installed, every command says so and fails.
fn before_install(cluster: &Cluster) -> Result<()> {
    for (args, want) in [
        (&["gpus"][..], "DAS is not installed on this cluster"),
        (&["free"][..], "DAS is not installed on this cluster"),
        (&["claims", "-A"][..], "AllocationClaim CRD"),
    ] {
        let (success, out, err) = kubectl_das(&cluster.kubeconfig, args)?;
        ensure!(!success && out.is_empty(), "{args:?} succeeded: {out}");
        ensure!(err.contains(want), "{args:?}: {err}");
    }
    let (success, _, err) = kubectl_das(&cluster.kubeconfig, &["gpus", "--context", "nope"])?;
    ensure!(!success && err.contains("nope"), "{err}");
    Ok(())
}

async fn with_slices(cluster: &Cluster) -> Result<()> {
    let client = cluster.client();
    let kc = &cluster.kubeconfig;
    create_template(&client, "one-1g", "1g.10gb", 1).await?;
    create_template(&client, "one-3g", "3g.40gb", 1).await?;
    create_template(&client, "two-1g", "1g.10gb", 2).await?;
    let pods = [("small", "one-1g"), ("big", "one-3g"), ("pair", "two-1g")];
    for (pod, template) in pods {
        create_pod(&client, pod, template, Some(NODE)).await?;
    }
    for (pod, _) in pods {
        wait_running(&client, pod).await?;
    }
    let allocs: Api<AllocationClaim> = Api::namespaced(client.clone(), NS);
    let claims = wait::until("4 AllocationClaims inUse", wait::TIMEOUT, || async {
        let list = allocs.list(&ListParams::default()).await?.items;
        let in_use = list
            .iter()
            .filter(|a| {
                a.status
                    .as_ref()
                    .is_some_and(|s| s.state.as_str() == "inUse")
            })
            .count();
        Ok((in_use == 4 && list.len() == 4).then_some(list))
    })
    .await?;

    // claims -o json: the same objects.
    let json: Value = serde_json::from_str(&ok(kc, &["claims", "-o", "json"])?)?;
    let mut listed: Vec<String> = json["items"]
        .as_array()
        .context("items")?
        .iter()
        .filter_map(|i| i["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    let mut want: Vec<String> = claims
        .iter()
        .filter_map(|c| c.metadata.name.clone())
        .collect();
    listed.sort();
    want.sort();
    ensure!(
        listed == want,
        "kubectl das claims -o json {listed:?}, API {want:?}"
    );
    // claims as text: one row per claim with its node, profile, start, state and pod.
    let text = ok(kc, &["claims"])?;
    for c in &claims {
        let name = c.metadata.name.as_deref().unwrap_or_default();
        let row = text
            .lines()
            .find(|l| l.starts_with(name))
            .with_context(|| format!("{name} missing from:\n{text}"))?;
        let pod = &c.spec.pod_ref.as_ref().context("podRef")?.name;
        let fields: Vec<&str> = row.split_whitespace().collect();
        ensure!(
            fields[1] == NODE
                && fields[3] == c.spec.profile
                && fields[4] == c.spec.mig_placement.start.to_string()
                && fields[5] == "inUse"
                && fields[6] == pod,
            "row {row:?} for {c:?}"
        );
    }

    // gpus -o json: every AllocationClaim held where it says, with its MIG UUID.
    let gpus: Value = serde_json::from_str(&ok(kc, &["gpus", "-o", "json"])?)?;
    let held: Vec<&Value> = gpus["gpus"]
        .as_array()
        .context("gpus")?
        .iter()
        .flat_map(|g| g["held"].as_array().into_iter().flatten())
        .collect();
    ensure!(held.len() == claims.len(), "held {held:?}");
    for c in &claims {
        let uuid = c.status.as_ref().and_then(|s| s.mig_uuid.clone());
        let found = held.iter().any(|h| {
            h["device"] == c.spec.device.as_str()
                && h["node"] == c.spec.nodename.as_str()
                && h["start"] == c.spec.mig_placement.start
                && h["pod"]
                    == c.spec
                        .pod_ref
                        .as_ref()
                        .map(|p| p.name.as_str())
                        .unwrap_or("")
                && h["migUuid"].as_str() == uuid.as_deref()
        });
        ensure!(found, "{:?} not in kubectl das gpus: {held:?}", c.spec);
    }

    // gpus as text, through kubectl's plugin mechanism: each pod's letter on exactly its cells.
    let path = format!(
        "{}:{}",
        kubectl_das_bin()?.parent().context("target dir")?.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new(workspace_root().join(".local/bin/kubectl"))
        .args(["das", "gpus"])
        .env("KUBECONFIG", kc)
        .env("PATH", path)
        .output()?;
    ensure!(
        out.status.success(),
        "kubectl das gpus: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout)?;
    ensure!(
        !text.contains('\u{1b}'),
        "colour without a terminal: {text:?}"
    );
    println!(
        "kubectl das gpus:\n{text}\nkubectl das free:\n{}",
        ok(kc, &["free"])?
    );
    let mut rows: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for l in text.lines() {
        if let Some((label, cells)) = l.split_once('[') {
            let gpu = label
                .split_whitespace()
                .nth(1)
                .unwrap_or_default()
                .to_string();
            let cells = cells
                .trim_end_matches(']')
                .split(' ')
                .map(str::to_string)
                .collect();
            rows.insert(gpu, cells);
        }
    }
    let letter_of = |pod: &str| -> Option<String> {
        text.lines()
            .find(|l| l.split_whitespace().nth(2) == Some(pod))
            .and_then(|l| l.split_whitespace().next().map(str::to_string))
    };
    for c in &claims {
        let pod = &c.spec.pod_ref.as_ref().context("podRef")?.name;
        let letter = letter_of(pod).with_context(|| format!("{pod} not in the legend:\n{text}"))?;
        let gpu = format!(
            "gpu-{}",
            c.spec.device.split('-').nth(1).unwrap_or_default()
        );
        let cells = rows
            .get(&gpu)
            .with_context(|| format!("{gpu} not drawn:\n{text}"))?;
        let (start, size) = (c.spec.mig_placement.start, c.spec.mig_placement.size);
        for i in start..start + size {
            ensure!(
                cells[i as usize] == letter,
                "{pod} at {gpu} cell {i}:\n{text}"
            );
        }
    }
    let painted: usize = rows.values().flatten().filter(|c| *c != ".").count();
    let sizes: i32 = claims.iter().map(|c| c.spec.mig_placement.size).sum();
    ensure!(
        painted == sizes as usize,
        "{painted} cells painted for {sizes} held:\n{text}"
    );

    // free: a GPU with anything on it has no room for a 7g.80gb; both had one before.
    let free: Value =
        serde_json::from_str(&ok(kc, &["free", "--profile", "7g.80gb", "-o", "json"])?)?;
    let used_gpus: std::collections::BTreeSet<String> =
        claims.iter().map(|c| c.spec.gpu_uuid.clone()).collect();
    ensure!(
        free["free"][0]["count"] == 2 - used_gpus.len(),
        "7g.80gb free {free} with {} GPUs in use",
        used_gpus.len()
    );
    let (success, _, err) = kubectl_das(kc, &["free", "--profile", "9g.1tb"])?;
    ensure!(!success && err.contains("1g.10gb"), "{err}");
    let (success, _, err) = kubectl_das(kc, &["gpus", "--node", "elsewhere"])?;
    ensure!(!success && err.contains("n0"), "{err}");

    // With the pods gone: nothing held, every 1g.10gb placement free again.
    delete_pods(&client, &["small", "big", "pair"]).await?;
    wait::until("free to show two empty H100s", wait::TIMEOUT, || async {
        let free: Value = serde_json::from_str(&ok(kc, &["free", "-o", "json"])?)?;
        let one = free["free"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|f| f["profile"] == "1g.10gb")
            .cloned();
        Ok(one.filter(|f| f["count"] == 14).map(|_| ()))
    })
    .await?;
    ensure!(ok(kc, &["gpus"])?.contains("No slices are held."));
    Ok(())
}
