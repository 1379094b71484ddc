//! The soak's workload: its ResourceClaimTemplates and Deployment, and the pod cycles drawn from
//! each cycle's seed (template pods, whole-GPU pods, legacy pods through the webhook, a shared
//! claim, two claims with shares of one slice, the Deployment scaled).

use std::time::{Duration, Instant};

use anyhow::Result;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use super::Run;
use crate::workload::NS;

/// A template's requests: (request name, profile, count).
type Requests = &'static [(&'static str, &'static str, u32)];

/// ResourceClaimTemplates the pods use: (name, requests).
const TEMPLATES: &[(&str, Requests)] = &[
    ("soak-1g10", &[("mig", "1g.10gb", 1)]),
    ("soak-two-1g10", &[("mig", "1g.10gb", 2)]),
    (
        "soak-a100-mixed",
        &[("small", "1g.5gb", 1), ("big", "2g.10gb", 1)],
    ),
    (
        "soak-h100-mixed",
        &[("small", "1g.20gb", 1), ("big", "3g.40gb", 1)],
    ),
    ("soak-h100-7g", &[("mig", "7g.80gb", 1)]),
    (
        "soak-a100-three",
        &[("a", "1g.5gb", 1), ("b", "1g.10gb", 1), ("c", "1g.5gb", 1)],
    ),
];

/// The ResourceClaimTemplate of whole-GPU pods: one GPU of DeviceClass `gpu.das.com`, which
/// only the node whose GPUs switch MIG mode ([`super::SWITCHING_NODE`]) publishes.
const WHOLE_GPU_TEMPLATE: &str = "soak-whole-gpu";

/// Legacy pods' requests: (resource, count).
const LEGACY: &[&[(&str, u32)]] = &[
    &[("nvidia.com/mig-1g.10gb", 1)],
    &[("nvidia.com/mig-1g.5gb", 2)],
    &[("nvidia.com/mig-1g.10gb", 1), ("nvidia.com/mig-2g.20gb", 1)],
];

pub(super) async fn setup_workloads(client: &Client) -> Result<()> {
    use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
    let api: Api<ResourceClaimTemplate> = Api::namespaced(client.clone(), NS);
    for (name, requests) in TEMPLATES {
        let requests: Vec<Value> = requests
            .iter()
            .map(|(r, profile, count)| {
                json!({"name": r, "exactly": {
                    "deviceClassName": das_api::profile_device_class(profile),
                    "allocationMode": "ExactCount", "count": count}})
            })
            .collect();
        let t: ResourceClaimTemplate = serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": requests}}}
        }))?;
        api.create(&PostParams::default(), &t).await?;
    }
    let whole: ResourceClaimTemplate = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": WHOLE_GPU_TEMPLATE},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": das_api::DEVICE_CLASS_WHOLE_GPU,
            "allocationMode": "ExactCount", "count": 1}}]}}}
    }))?;
    api.create(&PostParams::default(), &whole).await?;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
    let d: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "soak-dep"},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "soak-dep"}},
            "template": {"metadata": {"labels": {"app": "soak-dep"}}, "spec": {
                "resourceClaims": [{"name": "mig", "resourceClaimTemplateName": "soak-1g10"}],
                "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": "mig"}]}}],
                "terminationGracePeriodSeconds": 0}}}
    }))?;
    deployments.create(&PostParams::default(), &d).await?;
    Ok(())
}

/// One pod cycle, its kind and behaviour drawn from the cycle's own seed.
pub(super) async fn cycle(run: &Run, n: usize) -> Result<()> {
    let mut rng = StdRng::seed_from_u64(run.seed.wrapping_add(n as u64 * 7919));
    let kind = match rng.random_range(0..100) {
        0..47 => "template pod",
        47..55 => "whole-GPU pod",
        55..80 => "legacy pod",
        80..86 => "shared claim (2 pods)",
        86..92 => "shares of one slice (2 claims)",
        _ => "deployment scale",
    };
    *run.report.lock().await.cycles.entry(kind).or_default() += 1;
    let name = format!("soak-{n}");
    match kind {
        "template pod" => {
            let (template, _) = TEMPLATES[rng.random_range(0..TEMPLATES.len())];
            let spec = json!({
                "resourceClaims": [{"name": "mig", "resourceClaimTemplateName": template}],
                "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": "mig"}]}}],
            });
            pod_cycle(run, &name, spec, &mut rng).await
        }
        "whole-GPU pod" => {
            let spec = json!({
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": WHOLE_GPU_TEMPLATE}],
                "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": "gpu"}]}}],
            });
            pod_cycle(run, &name, spec, &mut rng).await
        }
        "legacy pod" => {
            let limits: serde_json::Map<String, Value> = LEGACY[rng.random_range(0..LEGACY.len())]
                .iter()
                .map(|(r, c)| (r.to_string(), json!(c.to_string())))
                .collect();
            let spec = json!({"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                "resources": {"limits": limits}}]});
            pod_cycle(run, &name, spec, &mut rng).await
        }
        "shared claim (2 pods)" => shared_claim(run, &name).await,
        "shares of one slice (2 claims)" => shares(run, &name, &mut rng).await,
        _ => {
            let replicas = rng.random_range(0..4);
            let api: Api<Deployment> = Api::namespaced(run.client.clone(), NS);
            api.patch(
                "soak-dep",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": replicas}})),
            )
            .await?;
            tokio::time::sleep(Duration::from_millis(rng.random_range(500..3000))).await;
            Ok(())
        }
    }
}

/// Creates pod `name` with `spec` (retrying while the webhook is down), waits until it runs (or
/// stays Pending), holds it a little, and deletes it; 10 % are force-deleted right after
/// creation, during their prepare, and 30 % of the others with grace period 0.
async fn pod_cycle(run: &Run, name: &str, mut spec: Value, rng: &mut StdRng) -> Result<()> {
    spec["terminationGracePeriodSeconds"] = json!(if rng.random_bool(0.3) { 0 } else { 1 });
    let pod: Pod = serde_json::from_value(
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}),
    )?;
    let api: Api<Pod> = Api::namespaced(run.client.clone(), NS);
    let t0 = Instant::now();
    let mut tries = 0;
    loop {
        match api.create(&PostParams::default(), &pod).await {
            Ok(_) => break,
            Err(e) if tries < 30 => {
                tries += 1;
                tracing::debug!(pod = name, error = %e, "create refused; retrying");
                run.report.lock().await.refused_creates += 1;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    if rng.random_bool(0.1) {
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..500))).await;
        run.report.lock().await.force_deletes_during_prepare += 1;
        return delete_pod(&api, name, true).await;
    }
    match wait_running_or_pending(&api, name, Duration::from_secs(60)).await? {
        Outcome::Running => {
            run.report.lock().await.create_to_running.push(t0.elapsed());
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..2000))).await;
        }
        Outcome::Unschedulable => run.report.lock().await.unschedulable += 1,
        Outcome::Stuck => tracing::warn!(pod = name, "not running after 60 s; deleting it"),
    }
    delete_pod(&api, name, rng.random_bool(0.3)).await
}

/// A ResourceClaim used by two pods: both run (on one node), then go, then the claim.
async fn shared_claim(run: &Run, name: &str) -> Result<()> {
    let claims: Api<ResourceClaim> = Api::namespaced(run.client.clone(), NS);
    let rc: ResourceClaim = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "mig", "exactly": {
            "deviceClassName": das_api::profile_device_class("1g.10gb")}}]}}
    }))?;
    claims.create(&PostParams::default(), &rc).await?;
    let api: Api<Pod> = Api::namespaced(run.client.clone(), NS);
    let pods = [format!("{name}-a"), format!("{name}-b")];
    let t0 = Instant::now();
    for p in &pods {
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": p},
            "spec": {"resourceClaims": [{"name": "mig", "resourceClaimName": name}],
                "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": "mig"}]}}],
                "terminationGracePeriodSeconds": 0}
        }))?;
        api.create(&PostParams::default(), &pod).await?;
    }
    for p in &pods {
        if let Outcome::Running = wait_running_or_pending(&api, p, Duration::from_secs(60)).await? {
            run.report.lock().await.create_to_running.push(t0.elapsed());
        }
    }
    for p in &pods {
        delete_pod(&api, p, false).await?;
    }
    claims.delete(name, &DeleteParams::default()).await?;
    Ok(())
}

/// Two claims with shares (1 to 3 of the slice's 4) of a shareable `1g.5gb` device and a pod
/// each: both run (on one slice when they fit on one), then go (in either order), then the
/// claims.
async fn shares(run: &Run, name: &str, rng: &mut StdRng) -> Result<()> {
    let claims: Api<ResourceClaim> = Api::namespaced(run.client.clone(), NS);
    let api: Api<Pod> = Api::namespaced(run.client.clone(), NS);
    let mut names = vec![format!("{name}-s1"), format!("{name}-s2")];
    let t0 = Instant::now();
    for n in &names {
        let shares = rng.random_range(1..=3).to_string();
        let exactly = json!({"deviceClassName": das_api::shared_profile_device_class("1g.5gb"),
            "capacity": {"requests": {"shares": shares}}});
        crate::workload::create_claim_pod(&run.client, n, exactly, None).await?;
    }
    for n in &names {
        if let Outcome::Running = wait_running_or_pending(&api, n, Duration::from_secs(60)).await? {
            run.report.lock().await.create_to_running.push(t0.elapsed());
        }
    }
    tokio::time::sleep(Duration::from_millis(rng.random_range(0..1000))).await;
    if rng.random_bool(0.5) {
        names.reverse();
    }
    for n in &names {
        delete_pod(&api, n, rng.random_bool(0.3)).await?;
        claims.delete(n, &DeleteParams::default()).await?;
    }
    Ok(())
}

enum Outcome {
    Running,
    Unschedulable,
    Stuck,
}

async fn wait_running_or_pending(api: &Api<Pod>, name: &str, limit: Duration) -> Result<Outcome> {
    let t0 = Instant::now();
    loop {
        if let Some(p) = api.get_opt(name).await? {
            let status = p.status.unwrap_or_default();
            if status.phase.as_deref() == Some("Running") {
                return Ok(Outcome::Running);
            }
            let unschedulable = status.conditions.iter().flatten().any(|c| {
                c.type_ == "PodScheduled"
                    && c.status == "False"
                    && c.reason.as_deref() == Some("Unschedulable")
            });
            if unschedulable && t0.elapsed() > Duration::from_secs(5) {
                return Ok(Outcome::Unschedulable);
            }
        }
        if t0.elapsed() > limit {
            return Ok(Outcome::Stuck);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn delete_pod(api: &Api<Pod>, name: &str, force: bool) -> Result<()> {
    let dp = if force {
        DeleteParams::default().grace_period(0)
    } else {
        DeleteParams::default()
    };
    match api.delete(name, &dp).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
        Err(e) => return Err(e.into()),
    }
    // Wait for it to be gone, so the cycle ends with its claim released (bounded).
    let t0 = Instant::now();
    while api.get_opt(name).await?.is_some() && t0.elapsed() < Duration::from_secs(90) {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(())
}
