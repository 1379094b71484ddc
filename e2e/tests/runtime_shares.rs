//! Shares are a tenant's own on a real-runtime node (docs/design.md §7, "Shares are a tenant's
//! own"): the upstream kubelet with containerd v2, runc and CDI ([`das_e2e::runtime`]), DAS
//! installed from the chart with `1g.10gb` shared (the plugin's emulated GPUs with stand-in
//! device nodes and the stand-in MPS daemon, das-webhook registered with the chart's
//! MutatingWebhookConfiguration). Two probe containers of one namespace, each with its own
//! claim for a share, run on one slice (the same MIG UUID, the MPS pipe directory and each its
//! own thread percentage, as containerd resolved them from the CDI specs); a third in another
//! namespace runs on a slice of its own.
//!
//! Needs root, runc and `make containerd`; `make e2e` builds them. Run it alone on a machine
//! others test on: `flock /tmp/das-runtime-node.lock cargo test -p das-e2e --test runtime_shares`.

use anyhow::{Context, Result, ensure};
use das_e2e::container_view::ContainerView;
use das_e2e::das;
use das_e2e::install::{self, Binaries};
use das_e2e::plugin::live_slices;
use das_e2e::runtime::{self, PROBE_IMAGE};
use das_e2e::tenants::{create_namespace, create_pod_in, create_share_claim};
use das_e2e::wait::{self, TIMEOUT};
use das_e2e::{Cluster, ClusterConfig};
use k8s_openapi::api::core::v1::Pod;
use kube::api::LogParams;
use kube::{Api, Client};
use serde_json::json;

const NODE: &str = "r0";
const GPUS: &str = "H100-80GB:1";
const SHARED: &str = "1g.10gb.shared.mig.das.com";

#[tokio::test]
async fn two_namespaces_never_share_a_slice_on_a_real_runtime() {
    let mut config = ClusterConfig::with_nodes(&[]);
    config.runtime_nodes = vec![NODE.into()];
    let mut cluster = Cluster::start(config).await.expect("cluster starts");
    let setup = async {
        let bins = Binaries::in_target_dir("debug", true)?;
        let rendered = das_e2e::chart::render_with(&["sharing.profiles={1g.10gb}"])?;
        let nodes = [(NODE.to_string(), GPUS.to_string())];
        install::install_rendered(&mut cluster, &rendered, &nodes, &bins).await?;
        das::wait_pool_complete(&cluster.client(), NODE).await?;
        for ns in ["team-a", "team-b"] {
            create_namespace(&cluster.client(), ns).await?;
        }
        Ok(())
    };
    if let Err(e) = setup.await {
        return cluster.check(Err(e));
    }
    cluster.check(scenario(&cluster).await);
}

/// Claim `<ns>/<name>` for one share of [`SHARED`] and pod `<ns>/<name>` on [`NODE`] whose
/// probe container `app` uses it; returns what the container reported.
async fn share(c: &Client, ns: &str, name: &str) -> Result<ContainerView> {
    create_share_claim(c, ns, name, SHARED, None).await?;
    let spec = json!({
        "nodeSelector": {"kubernetes.io/hostname": NODE},
        "tolerations": [{"key": runtime::TAINT_KEY, "operator": "Exists"}],
        "terminationGracePeriodSeconds": 0,
        "resourceClaims": [{"name": "mig", "resourceClaimName": name}],
        "containers": [{"name": "app", "image": PROBE_IMAGE, "imagePullPolicy": "Never",
            "resources": {"claims": [{"name": "mig"}]}}]
    });
    create_pod_in(c, ns, name, spec).await?;
    let pods: Api<Pod> = Api::namespaced(c.clone(), ns);
    let logs = LogParams {
        container: Some("app".into()),
        ..Default::default()
    };
    wait::until(&format!("{ns}/{name}'s probe report"), TIMEOUT, || async {
        let running = pods
            .get(name)
            .await?
            .status
            .and_then(|s| s.phase)
            .is_some_and(|p| p == "Running");
        if !running {
            return Ok(None);
        }
        Ok(pods
            .logs(name, &logs)
            .await
            .ok()
            .and_then(|log| runtime::probe_view(&log).ok()))
    })
    .await
}

async fn scenario(cluster: &Cluster) -> Result<()> {
    let c = cluster.client();
    let a1 = share(&c, "team-a", "a1").await?;
    let a2 = share(&c, "team-a", "a2").await?;
    let b1 = share(&c, "team-b", "b1").await?;
    let mig = |v: &ContainerView, who: &str| -> Result<String> {
        let uuids = v.mig_uuids();
        ensure!(uuids.len() == 1, "{who} sees {uuids:?}");
        Ok(uuids[0].clone())
    };
    let (m_a1, m_a2, m_b1) = (mig(&a1, "a1")?, mig(&a2, "a2")?, mig(&b1, "b1")?);
    ensure!(
        m_a1 == m_a2,
        "team-a's two containers run on two slices: {m_a1} {m_a2}"
    );
    ensure!(
        m_b1 != m_a1,
        "team-b's container runs on team-a's slice {m_a1}"
    );
    for (who, v) in [("a1", &a1), ("a2", &a2), ("b1", &b1)] {
        let env = |k: &str| v.env.get(k).map(String::as_str);
        ensure!(
            env("CUDA_MPS_PIPE_DIRECTORY") == Some("/tmp/nvidia-mps")
                && env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") == Some("25"),
            "{who}: its share's MPS environment: {:?}",
            v.env
        );
    }
    // The runtime gave team-b's container other capability nodes than team-a's.
    let caps = |v: &ContainerView| -> Vec<String> {
        let mut n: Vec<String> = v
            .device_nodes
            .iter()
            .filter(|d| d.starts_with("/dev/nvidia-caps/"))
            .cloned()
            .collect();
        n.sort();
        n
    };
    ensure!(caps(&a1) == caps(&a2), "{:?} {:?}", caps(&a1), caps(&a2));
    ensure!(caps(&a1) != caps(&b1), "one slice's nodes: {:?}", caps(&b1));
    let slices = live_slices(cluster, NODE)?;
    ensure!(
        slices.len() == 2,
        "two slices for two namespaces expected: {slices:?}"
    );
    let seen: Vec<&str> = slices.iter().map(|s| s.3.as_str()).collect();
    ensure!(
        seen.contains(&m_a1.as_str()) && seen.contains(&m_b1.as_str()),
        "the live slices {seen:?} are not the containers' ({m_a1}, {m_b1})"
    );
    let published =
        das_e2e::tenants::share_namespace(&c, NODE, &device_of(&c, "team-a", "a1").await?).await?;
    ensure!(
        published.as_deref() == Some("team-a"),
        "team-a's device publishes {published:?}"
    );
    Ok(())
}

/// The device claim `<ns>/<name>` was allocated.
async fn device_of(c: &Client, ns: &str, name: &str) -> Result<String> {
    let rc = Api::<k8s_openapi::api::resource::v1::ResourceClaim>::namespaced(c.clone(), ns)
        .get(name)
        .await?;
    Ok(das_e2e::tenants::first_result(&rc)
        .context("allocated")?
        .device)
}
