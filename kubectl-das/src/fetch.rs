//! Reads what `kubectl das` shows from the API server, and turns "not there" into errors that
//! say what is missing and how to get it.

use anyhow::{Context, Result, bail};
use das_api::allocation::AllocationClaim;
use das_api::{DEVICE_CLASS_ALL, DRIVER_NAME};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::Resource;
use kube::api::{Api, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::{ObjectList, Request};
use kube::{Client, Config};

use crate::fields::SliceFields;
use crate::inventory::{Inventory, PublishedSlice};

/// A client for `kubeconfig` (or `$KUBECONFIG`, `~/.kube/config`, then the in-cluster service
/// account, as kubectl looks) and `context` (default: the current one).
///
/// # Errors
/// The kubeconfig cannot be read or has no such context.
pub async fn client(kubeconfig: Option<&std::path::Path>, context: Option<&str>) -> Result<Client> {
    let opts = KubeConfigOptions {
        context: context.map(str::to_string),
        ..Default::default()
    };
    let config = match kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path)
                .with_context(|| format!("read kubeconfig {}", path.display()))?;
            Config::from_custom_kubeconfig(kc, &opts).await?
        }
        None if context.is_some() => Config::from_kubeconfig(&opts).await?,
        None => Config::infer()
            .await
            .context("no kubeconfig found ($KUBECONFIG, ~/.kube/config) and not in a cluster")?,
    };
    Ok(Client::try_from(config)?)
}

/// ResourceSlices per list page. A DAS slice of 64 devices is about 50 kB of JSON: a page is a
/// few MB whatever the cluster's size, and each page is cut down to [`PublishedSlice`]s and
/// dropped before the next is asked for. (One list of 1000 nodes × 8 H100 is about 160 MB of
/// JSON, and 1.5 GiB of RSS decoded whole; docs/benchmarks.md.)
pub const SLICE_PAGE_SIZE: u32 = 100;

/// DAS's ResourceSlices and every ResourceClaim, read into an [`Inventory`].
///
/// # Errors
/// The cluster does not serve `resource.k8s.io/v1`, DAS is not installed, or no node plugin has
/// published a GPU yet.
pub async fn inventory(client: &Client) -> Result<Inventory> {
    let slices = match published_slices(client, SLICE_PAGE_SIZE).await {
        Ok(slices) => slices,
        Err(e) => match e.downcast_ref::<kube::Error>() {
            Some(k) if is_not_found(k) => bail!(
                "this cluster does not serve resource.k8s.io/v1 ResourceSlices: DAS needs \
                 Kubernetes 1.34 or newer with Dynamic Resource Allocation"
            ),
            _ => return Err(e),
        },
    };
    if slices.is_empty() {
        let classes: Api<DeviceClass> = Api::all(client.clone());
        match classes.get_opt(DEVICE_CLASS_ALL).await? {
            None => bail!(
                "DAS is not installed on this cluster: no DeviceClass {DEVICE_CLASS_ALL} and no \
                 ResourceSlice of driver {DRIVER_NAME}. Install it with `helm install das \
                 deploy/helm/das -n das-system --create-namespace` (docs/operations.md)"
            ),
            Some(_) => bail!(
                "DAS is installed (DeviceClass {DEVICE_CLASS_ALL} exists) but no node has \
                 published GPUs yet: check the node plugin pods (`kubectl -n das-system get pods \
                 -l app.kubernetes.io/name=das-kubelet-plugin`) and that GPU nodes have MIG mode on"
            ),
        }
    }
    let claims: Api<ResourceClaim> = Api::all(client.clone());
    let claims = claims
        .list(&ListParams::default())
        .await
        .context("list ResourceClaims")?
        .items;
    Ok(Inventory::from_published(slices, &claims))
}

/// Every ResourceSlice of DAS, listed `page_size` at a time, each page decoded straight into
/// [`SliceFields`] (only what the inventory reads) and cut down to [`PublishedSlice`]s before
/// the next is asked for. A list whose continue token expired (410 Gone, after etcd compacted
/// the revision it started from) starts over once.
///
/// # Errors
/// The list is refused (a [`kube::Error`] inside), or a counter is not a quantity.
pub async fn published_slices(client: &Client, page_size: u32) -> Result<Vec<PublishedSlice>> {
    let first = ListParams::default()
        .fields(&format!("spec.driver={DRIVER_NAME}"))
        .limit(page_size);
    let request = Request::new(ResourceSlice::url_path(&(), None));
    let mut lp = first.clone();
    let mut started_over = false;
    let mut slices = Vec::new();
    loop {
        let page: ObjectList<SliceFields> = match client.request(request.list(&lp)?).await {
            Ok(page) => page,
            Err(kube::Error::Api(e))
                if e.code == 410 && lp.continue_token.is_some() && !started_over =>
            {
                started_over = true;
                slices.clear();
                lp = first.clone();
                continue;
            }
            Err(e) => return Err(anyhow::Error::new(e).context("list ResourceSlices")),
        };
        let cont = page.metadata.continue_.filter(|c| !c.is_empty());
        for s in page.items {
            slices.extend(PublishedSlice::from_fields(s)?);
        }
        match cont {
            Some(token) => lp = lp.continue_token(&token),
            None => return Ok(slices),
        }
    }
}

/// The AllocationClaims of `namespace` (every namespace for `None`).
///
/// # Errors
/// The AllocationClaim CRD is not installed (the DAS controller is not), or the list is refused.
pub async fn allocation_claims(
    client: &Client,
    namespace: Option<&str>,
) -> Result<Vec<AllocationClaim>> {
    let api: Api<AllocationClaim> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    match api.list(&ListParams::default()).await {
        Ok(list) => Ok(list.items),
        Err(e) if is_not_found(&e) => bail!(
            "the AllocationClaim CRD (allocationclaims.{}) is not installed: DAS's controller is \
             not installed on this cluster (the Helm chart installs both)",
            das_api::allocation::GROUP
        ),
        Err(e) => Err(e).context("list AllocationClaims"),
    }
}

/// `node` (when given) has published GPUs.
///
/// # Errors
/// It has not; the message lists the nodes that have.
pub fn check_node(inv: &Inventory, node: Option<&str>) -> Result<()> {
    if let Some(n) = node
        && !inv.nodes().contains(&n)
    {
        bail!(
            "node {n:?} has published no DAS GPUs; nodes with GPUs: {}",
            inv.nodes().join(", ")
        );
    }
    Ok(())
}

fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}
