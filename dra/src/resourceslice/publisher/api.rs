//! [`PublishApi`]: the API-server calls of the publisher, and [`KubePublishApi`], the kube
//! client behind them.

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{DeleteParams, ListParams, PostParams, Preconditions};
use kube::{Api, Client};

/// The API-server calls of [`super::Publisher`], behind a trait so unit tests can answer them
/// (`testing::FakeSliceApi` answers like kube-apiserver's ResourceSlice registry). Errors are
/// the client's.
#[tonic::async_trait]
pub trait PublishApi: Send + Sync + 'static {
    /// The ResourceSlices matching `field_selector`.
    async fn list(&self, field_selector: &str) -> Result<Vec<ResourceSlice>, kube::Error>;
    /// The Node `name`.
    async fn node(&self, name: &str) -> Result<Node, kube::Error>;
    /// Creates `slice` (with `dry_run`, only as the server would: nothing is stored) and returns
    /// what the server stored or would store.
    async fn create(
        &self,
        slice: &ResourceSlice,
        dry_run: bool,
    ) -> Result<ResourceSlice, kube::Error>;
    /// Replaces `slice` (by name) and returns what the server stored.
    async fn replace(&self, slice: &ResourceSlice) -> Result<ResourceSlice, kube::Error>;
    /// Deletes the slice `name` if it still has the `preconditions`.
    async fn delete(&self, name: &str, preconditions: Preconditions) -> Result<(), kube::Error>;
}

/// [`PublishApi`] over a kube client.
pub struct KubePublishApi {
    slices: Api<ResourceSlice>,
    nodes: Api<Node>,
}

impl KubePublishApi {
    /// Calls through `client` (built with connect and read timeouts).
    pub fn new(client: Client) -> Self {
        Self {
            slices: Api::all(client.clone()),
            nodes: Api::all(client),
        }
    }
}

#[tonic::async_trait]
impl PublishApi for KubePublishApi {
    async fn list(&self, field_selector: &str) -> Result<Vec<ResourceSlice>, kube::Error> {
        let lp = ListParams::default().fields(field_selector);
        Ok(self.slices.list(&lp).await?.items)
    }

    async fn node(&self, name: &str) -> Result<Node, kube::Error> {
        self.nodes.get(name).await
    }

    async fn create(
        &self,
        slice: &ResourceSlice,
        dry_run: bool,
    ) -> Result<ResourceSlice, kube::Error> {
        let pp = PostParams {
            dry_run,
            ..Default::default()
        };
        self.slices.create(&pp, slice).await
    }

    async fn replace(&self, slice: &ResourceSlice) -> Result<ResourceSlice, kube::Error> {
        let name = slice.metadata.name.as_deref().unwrap_or_default();
        self.slices
            .replace(name, &PostParams::default(), slice)
            .await
    }

    async fn delete(&self, name: &str, preconditions: Preconditions) -> Result<(), kube::Error> {
        let dp = DeleteParams {
            preconditions: Some(preconditions),
            ..Default::default()
        };
        self.slices.delete(name, &dp).await.map(drop)
    }
}
