//! [`ClaimApi`]: the API-server calls of the request path, behind a trait so the request path's
//! decisions can be driven through adversarial interleavings in unit tests; [`KubeClaimApi`] is
//! the implementation the plugin runs (the e2e tests drive it against a real API server).

use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::handler::ClaimRef;
use crate::claims::carve::{self, CarveOutcome};
use crate::claims::checkpoint::RecordedDevice;
pub use crate::claims::error::ApiError;
use crate::claims::kinds::Kinds;
use crate::events::{EventKind, EventSink, EventTarget, KubeEvents};

/// Field manager of the plugin's writes to `ResourceClaim.status.devices` (the reporter of its
/// events too).
pub const FIELD_MANAGER: &str = crate::events::REPORTER;

/// Longest any one API call may take before it counts as failed (on top of the client's own
/// connect and read timeouts): a hung call must not hold a claim's lock or the handover gate.
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The API-server calls the request path makes, and the events it posts ([`EventSink`], a
/// supertrait so an `Arc<dyn ClaimApi>` posts events too). Implementations bound every call in
/// time (see [`CALL_TIMEOUT`]).
#[tonic::async_trait]
pub trait ClaimApi: EventSink {
    /// The ResourceClaim `namespace/name`, `None` when there is none.
    async fn get_claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ResourceClaim>, ApiError>;
    /// The ResourceClaims allocated (at least in part) to this node's pool: the start-up rebuild
    /// of a lost checkpoint. Listed in pages of [`CLAIM_PAGE_SIZE`], each page filtered before
    /// the next is asked for, so the plugin never holds the cluster's claims at once.
    async fn list_claims(&self) -> Result<Vec<ResourceClaim>, ApiError>;
    /// Server-side applies the plugin's entries of `status.devices` for `devices` (condition
    /// `Ready`, the instance data), on the claim with exactly `claim.uid`.
    async fn write_status(
        &self,
        claim: &ClaimRef,
        devices: &[RecordedDevice],
    ) -> Result<(), ApiError>;
    /// Server-side applies the entries of `status.devices` of a carve before bind
    /// ([`crate::claims::carve`]): per device `mig.das.com/SliceReady` or
    /// `mig.das.com/SliceFailed` True, on the claim with exactly `claim.uid`. The default writes
    /// nothing (API doubles of tests that never carve).
    async fn write_carve_status(
        &self,
        claim: &ClaimRef,
        devices: &[RecordedDevice],
        outcome: &CarveOutcome,
    ) -> Result<(), ApiError> {
        let _ = (claim, devices, outcome);
        Ok(())
    }
}

/// ResourceClaims per page when the plugin lists them (a cold start without its checkpoint): a
/// page of claims is tens of kB to a few MB, whatever the cluster's size.
pub(crate) const CLAIM_PAGE_SIZE: u32 = 500;

/// Whether `rc` has a result of the DAS driver in `node`'s pool.
pub(crate) fn allocated_to(rc: &ResourceClaim, node: &str) -> bool {
    das_api::claim_status::our_results(rc).any(|r| r.pool == node)
}

/// [`ClaimApi`] over a kube client.
pub struct KubeClaimApi {
    client: Client,
    events: KubeEvents,
    node: String,
    call_timeout: Duration,
    slice_ready: bool,
}

impl KubeClaimApi {
    /// Calls through `client` (build it with connect and read timeouts); events are reported as
    /// `das-kubelet-plugin` on `node`.
    pub fn new(client: Client, node: &str) -> Self {
        Self {
            events: KubeEvents::new(client.clone(), node).with_timeout(CALL_TIMEOUT),
            client,
            node: node.to_string(),
            call_timeout: CALL_TIMEOUT,
            slice_ready: false,
        }
    }

    /// With carve before bind on: every prepared MIG device's entry keeps the
    /// `mig.das.com/SliceReady` condition the carve wrote (the prepare's apply, by the same
    /// field manager, replaces the entry's conditions).
    pub fn with_slice_ready(mut self, on: bool) -> Self {
        self.slice_ready = on;
        self
    }

    /// Bounds every call (event posts included) by `limit` instead of [`CALL_TIMEOUT`] (for
    /// tests of the bound).
    #[cfg(test)]
    pub(crate) fn with_call_timeout(mut self, limit: Duration) -> Self {
        self.call_timeout = limit;
        self.events = self.events.with_timeout(limit);
        self
    }

    /// Runs an API call within the call timeout.
    async fn bounded<T>(
        &self,
        what: &str,
        call: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, ApiError> {
        match tokio::time::timeout(self.call_timeout, call).await {
            Ok(r) => r.map_err(ApiError::from),
            Err(_) => Err(ApiError::transient(format!(
                "{what}: no answer from the API server within {:?}",
                self.call_timeout
            ))),
        }
    }
}

#[tonic::async_trait]
impl ClaimApi for KubeClaimApi {
    async fn get_claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ResourceClaim>, ApiError> {
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), namespace);
        self.bounded("read the ResourceClaim", api.get_opt(name))
            .await
    }

    async fn list_claims(&self) -> Result<Vec<ResourceClaim>, ApiError> {
        let api: Api<ResourceClaim> = Api::all(self.client.clone());
        let mut params = ListParams::default().limit(CLAIM_PAGE_SIZE);
        let mut here = Vec::new();
        loop {
            let page = self
                .bounded("list ResourceClaims", api.list(&params))
                .await?;
            here.extend(
                page.items
                    .into_iter()
                    .filter(|rc| allocated_to(rc, &self.node)),
            );
            match page.metadata.continue_ {
                Some(token) if !token.is_empty() => params = params.continue_token(&token),
                _ => return Ok(here),
            }
        }
    }

    async fn write_status(
        &self,
        claim: &ClaimRef,
        devices: &[RecordedDevice],
    ) -> Result<(), ApiError> {
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let body = status_apply_body_with(claim, devices, now, self.slice_ready);
        self.apply_status(claim, &body).await
    }

    async fn write_carve_status(
        &self,
        claim: &ClaimRef,
        devices: &[RecordedDevice],
        outcome: &CarveOutcome,
    ) -> Result<(), ApiError> {
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let body = carve::carve_status_body(claim, devices, outcome, now);
        self.apply_status(claim, &body).await
    }
}

impl KubeClaimApi {
    /// Server-side applies `body` to the claim's status as [`FIELD_MANAGER`].
    async fn apply_status(
        &self,
        claim: &ClaimRef,
        body: &serde_json::Value,
    ) -> Result<(), ApiError> {
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &claim.namespace);
        let params = PatchParams::apply(FIELD_MANAGER).force();
        self.bounded(
            "write the claim's status.devices",
            api.patch_status(&claim.name, &params, &Patch::Apply(body)),
        )
        .await
        .map(drop)
    }
}

#[tonic::async_trait]
impl EventSink for KubeClaimApi {
    async fn event(&self, about: &EventTarget, kind: EventKind, reason: &str, note: String) {
        self.events.event(about, kind, reason, note).await;
    }
}

/// The server-side-apply body of the plugin's `status.devices` entries: per device the
/// [`das_api::claim_status::CONDITION_READY`] condition and the [`DeviceStatusData`] the AllocationClaim
/// controller reads, as each device's kind gives them (a whole GPU's: reason `GpuPrepared`,
/// [`das_api::claim_status::DeviceStatusData::whole_gpu`]).
/// `metadata.uid` makes the API server refuse the write (409) when the name now belongs to
/// another claim.
#[cfg(test)]
pub(crate) fn status_apply_body(
    claim: &ClaimRef,
    devices: &[RecordedDevice],
    now: Time,
) -> serde_json::Value {
    status_apply_body_with(claim, devices, now, false)
}

/// [`status_apply_body`], with `slice_ready` (carve before bind on) each MIG device's entry
/// also carrying the `mig.das.com/SliceReady` condition of its carve (a device of a kind that
/// is not carved, a whole GPU, does not).
pub(crate) fn status_apply_body_with(
    claim: &ClaimRef,
    devices: &[RecordedDevice],
    now: Time,
    slice_ready: bool,
) -> serde_json::Value {
    let kinds = Kinds::standard();
    let entries: Vec<_> = devices
        .iter()
        .map(|d| {
            let ready_time = Some(now.0.strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string());
            // Its data and message are its kind's (a whole GPU's: reason `GpuPrepared`).
            let kind = kinds.of_record(d);
            let (data, message) = kind.status(d, ready_time);
            let mut entry = data.ready_entry(&d.pool, &d.device, message, now.clone());
            // A share's entry is keyed by its shareID too (KEP-5075): several claims hold the
            // device, each with its own entry.
            entry.share_id = d.share.as_ref().map(|s| s.id.clone());
            if slice_ready && kind.carved_before_bind() {
                let c = carve::slice_ready(d, &now);
                entry.conditions.get_or_insert_with(Vec::new).push(c);
            }
            entry
        })
        .collect();
    status_devices_apply(claim, &entries)
}

/// [`das_api::claim_status::status_devices_apply`] for `claim`.
pub(crate) fn status_devices_apply(
    claim: &ClaimRef,
    entries: &[k8s_openapi::api::resource::v1::AllocatedDeviceStatus],
) -> serde_json::Value {
    das_api::claim_status::status_devices_apply(&claim.name, &claim.namespace, &claim.uid, entries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claims::testing::{MemoryApi, NODE};

    /// The cold-start listing keeps only the claims with a DAS result in this node's pool.
    #[tokio::test]
    async fn only_claims_allocated_to_this_node_are_kept_from_a_listing() {
        let api = MemoryApi::default();
        let here = api.allocate("ns", "here", "u1", &[("gpu", "gpu-0-mig-1g-10gb-6")]);
        api.allocate("ns", "gone", "u2", &[("gpu", "gpu-0-mig-1g-10gb-5")]);
        let all = api.list_claims().await.unwrap();
        let rc = |name: &str| {
            all.iter()
                .find(|c| c.metadata.name.as_deref() == Some(name))
        };
        assert!(allocated_to(rc(&here.name).unwrap(), NODE));
        assert!(!allocated_to(rc("gone").unwrap(), "another-node"));
        let mut unallocated = rc("gone").unwrap().clone();
        unallocated.status = None;
        assert!(!allocated_to(&unallocated, NODE));
    }
}
