//! One reconcile: makes a ResourceClaim's AllocationClaims equal to
//! [`desired_allocation_claims`] (docs/design.md §6), reading the pods, slices and
//! AllocationClaims from the controller's caches ([`Caches`]).
//!
//! Writes are server-side apply with field manager [`FIELD_MANAGER`]; nothing is written when
//! the stored object already matches. AllocationClaims of the claim that it no longer has
//! allocated are deleted. A failure is an [`Error`], counted by its label and retried with a
//! per-claim backoff ([`error_policy`]). The watches that start reconciles are wired in
//! [`crate::controller`]; AllocationClaims of claims that are gone are left to
//! [`crate::sweep`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use das_api::allocation::{AllocationClaim, AllocationState};
use das_api::claim_status::DeviceStatusData;
use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;

use crate::cache::{Caches, device_index, pods_named_by};
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::mirror::{
    carry_transition_time, desired_allocation_claims, desired_names, object_apply, writes_needed,
};
use crate::triggers::{Triggers, allocation_claim_key};
use crate::watching::Synced;

/// Field manager of every write (server-side apply).
pub const FIELD_MANAGER: &str = "das-controller";

/// Shared state of the reconciles.
pub struct Context {
    client: Client,
    caches: Caches,
    metrics: Arc<Metrics>,
    recorder: Recorder,
    failures: Mutex<HashMap<String, u32>>,
    /// The trigger filters; the reconcile records its own writes in them.
    triggers: Arc<Triggers>,
    /// Every reflector store has its first complete list: until then a reconcile writes and
    /// deletes nothing (a missing pod or slice would look like a reason to).
    synced: AtomicBool,
}

impl Context {
    /// The state of the reconciles: writes through `client`, reads `caches`, counts in
    /// `metrics`, publishes Events with `recorder` and records its own writes in `triggers`.
    /// Reconciles wait until [`Self::mark_synced`].
    pub fn new(
        client: Client,
        caches: Caches,
        metrics: Arc<Metrics>,
        recorder: Recorder,
        triggers: Arc<Triggers>,
    ) -> Self {
        Self {
            client,
            caches,
            metrics,
            recorder,
            failures: Mutex::default(),
            triggers,
            synced: AtomicBool::new(false),
        }
    }

    /// Every cache has its first complete list, as `_synced` proves: reconciles may write
    /// from now on, and the controller is ready (`/readyz`).
    pub fn mark_synced(&self, _synced: Synced) {
        self.set_synced();
        self.metrics.probe.set_ready(true);
    }

    /// Lets reconciles write. Private: outside this module only [`Self::mark_synced`], with
    /// its proof, reaches it; the unit tests' stores are complete from the start.
    fn set_synced(&self) {
        self.synced.store(true, Ordering::Release);
    }

    /// The client the reconciles (and the sweep) write through.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The controller's metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }
}

/// Whether `a` mirrors the claim with `uid`.
fn owned_by(a: &AllocationClaim, uid: &str) -> bool {
    a.owner_references().iter().any(|o| o.uid == uid)
}

/// Seconds since `time` (RFC 3339), if it parses and is in the past.
fn seconds_since(time: &str) -> Option<f64> {
    let t: Timestamp = time.parse().ok()?;
    let d = Timestamp::now().duration_since(t);
    (!d.is_negative()).then(|| d.as_secs_f64())
}

/// When `device` of `claim` was reported ready: the plugin's `readyTime` (milliseconds), else
/// the `Ready` condition's `lastTransitionTime` (whole seconds, from plugins before 0.3).
fn ready_since(claim: &ResourceClaim, device: &str) -> Option<String> {
    let devices = claim.status.as_ref()?.devices.as_ref()?;
    let d = devices.iter().find(|d| d.device == device)?;
    if let Some(t) = DeviceStatusData::of(d).and_then(|data| data.ready_time) {
        return Some(t);
    }
    let c = d.conditions.as_ref()?.iter().find(|c| c.type_ == "Ready")?;
    Some(c.last_transition_time.0.to_string())
}

/// This replica's sequence number of reconciles, the `trace_id` of each reconcile's span.
static RECONCILES: AtomicU64 = AtomicU64::new(0);

/// Makes `claim`'s AllocationClaims what they should be. Runs in a span `reconcile` (inside
/// kube-runtime's `reconciling object`) with the claim's `claim.uid`, `claim.namespace`,
/// `claim.name` and a `trace_id`: this replica's sequence number of the reconcile, which joins
/// the log lines of one reconcile (two reconciles of one claim have different ones). The span
/// is at level ERROR so that it stays on under any filter: a warn line still carries its claim
/// with `--log-level=warn` (as the node plugin's claim spans).
#[tracing::instrument(name = "reconcile", level = "error", skip_all, fields(
    claim.uid = claim.metadata.uid.as_deref().unwrap_or_default(),
    claim.namespace = claim.metadata.namespace.as_deref().unwrap_or_default(),
    claim.name = claim.metadata.name.as_deref().unwrap_or_default(),
    trace_id = RECONCILES.fetch_add(1, Ordering::Relaxed),
))]
pub async fn reconcile(claim: Arc<ResourceClaim>, ctx: Arc<Context>) -> Result<Action> {
    if !ctx.synced.load(Ordering::Acquire) {
        return Ok(Action::requeue(Duration::from_millis(500)));
    }
    let result = mirror_claim(&claim, &ctx).await;
    ctx.metrics.reconciled(result.is_ok());
    match &result {
        Ok(()) => {
            ctx.failures
                .lock()
                .expect("not poisoned")
                .remove(&key(&claim));
        }
        Err(e) => ctx.metrics.reconcile_error(e.metric_label()),
    }
    result.map(|()| Action::await_change())
}

fn key(claim: &ResourceClaim) -> String {
    format!(
        "{}/{}",
        claim.namespace().unwrap_or_default(),
        claim.name_any()
    )
}

/// The error for a claim without `field`.
fn missing(claim: &ResourceClaim, field: &'static str) -> Error {
    Error::MissingField {
        claim: key(claim),
        field,
    }
}

async fn mirror_claim(claim: &ResourceClaim, ctx: &Context) -> Result<()> {
    // Every stored claim has both; without them nothing could be written to the right place.
    let ns = claim
        .namespace()
        .ok_or_else(|| missing(claim, "metadata.namespace"))?;
    let uid = claim.uid().ok_or_else(|| missing(claim, "metadata.uid"))?;
    let pods = pods_named_by(claim, &ctx.caches.pods);
    let index = device_index(claim, &ctx.caches.slices);
    let now = Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    let mirror = desired_allocation_claims(claim, &pods, &index, &now);
    if !mirror.unmirrored.is_empty() {
        warn_unmirrored(claim, &mirror.unmirrored, ctx).await;
    }
    let existing = ctx
        .caches
        .allocs
        .state_filter(|a| a.namespace().as_deref() == Some(ns.as_str()) && owned_by(a, &uid));
    let api: Api<AllocationClaim> = Api::namespaced(ctx.client.clone(), &ns);
    for mut desired in mirror.claims {
        let key = allocation_claim_key(&desired);
        let cached = existing
            .iter()
            .find(|a| a.name_any() == desired.name_any())
            .cloned();
        // The cache may not show this controller's last write yet.
        let current = ctx.triggers.own_writes.freshest(&key, &uid, cached);
        if let Some(c) = &current {
            carry_transition_time(&mut desired, c);
        }
        let written = apply(&api, &desired, current.as_deref(), claim, ctx).await;
        if written.is_err() {
            ctx.triggers.own_writes.forget_latest(&key);
        }
        written?;
    }
    let keep = desired_names(claim);
    for stale in existing.iter().filter(|a| !keep.contains(&a.name_any())) {
        ctx.triggers
            .own_writes
            .forget_latest(&allocation_claim_key(stale));
        if delete_allocation_claim(&api, &stale.name_any(), &ctx.metrics).await? {
            tracing::info!(allocation_claim = %stale.name_any(), namespace = ?api.resource_url(), "deleted");
        }
    }
    Ok(())
}

/// Writes what differs between `desired` and `current`: the object (spec, labels, owner) and
/// then the status, each by server-side apply.
async fn apply(
    api: &Api<AllocationClaim>,
    desired: &AllocationClaim,
    current: Option<&AllocationClaim>,
    claim: &ResourceClaim,
    ctx: &Context,
) -> Result<()> {
    let w = writes_needed(desired, current);
    let name = desired.name_any();
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    if w.object {
        let (object, intended) = object_apply(desired, current);
        ctx.triggers.own_writes.record(&intended);
        let answer = api
            .patch(&name, &pp, &Patch::Apply(&object))
            .await
            .map_err(|source| Error::Apply {
                name: name.clone(),
                source,
            })?;
        ctx.triggers.own_writes.wrote(answer);
        ctx.metrics.wrote("apply");
    }
    if w.status {
        let status = serde_json::to_value(&desired.status).map_err(|source| Error::Serialize {
            name: name.clone(),
            source,
        })?;
        let body = json!({
            "apiVersion": AllocationClaim::api_version(&()),
            "kind": AllocationClaim::kind(&()),
            "metadata": {"name": name},
            "status": status,
        });
        ctx.triggers.own_writes.record(desired);
        let answer = api
            .patch_status(&name, &pp, &Patch::Apply(&body))
            .await
            .map_err(|source| Error::ApplyStatus {
                name: name.clone(),
                source,
            })?;
        ctx.triggers.own_writes.wrote(answer);
        ctx.metrics.wrote("status");
        observe_in_use(desired, current, claim, ctx);
        tracing::info!(
            claim = %key(claim), allocation_claim = %name,
            state = desired.status.as_ref().map_or("", |s| s.state.as_str()),
            "mirrored"
        );
    }
    Ok(())
}

/// Records the lag of an `inUse` transition.
fn observe_in_use(
    desired: &AllocationClaim,
    current: Option<&AllocationClaim>,
    claim: &ResourceClaim,
    ctx: &Context,
) {
    let state = |a: &AllocationClaim| a.status.as_ref().map(|s| s.state);
    if state(desired) != Some(AllocationState::InUse)
        || current.and_then(state) == Some(AllocationState::InUse)
    {
        return;
    }
    if let Some(lag) = ready_since(claim, &desired.spec.device).and_then(|t| seconds_since(&t)) {
        ctx.metrics.in_use_lag.observe(lag);
    }
}

/// Deletes AllocationClaim `name` (counted as a `delete` write); `Ok(false)` when it was gone
/// already. Used by the reconcile and by [`crate::sweep`].
pub async fn delete_allocation_claim(
    api: &Api<AllocationClaim>,
    name: &str,
    metrics: &Metrics,
) -> Result<bool> {
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => {
            metrics.wrote("delete");
            Ok(true)
        }
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
        Err(source) => Err(Error::Delete {
            name: name.to_string(),
            source,
        }),
    }
}

/// A Warning Event on the claim for results that cannot be mirrored; best effort.
async fn warn_unmirrored(claim: &ResourceClaim, why: &[String], ctx: &Context) {
    let event = Event {
        type_: EventType::Warning,
        reason: "CannotMirror".into(),
        note: Some(format!("no AllocationClaim for: {}", why.join("; "))),
        action: "MirrorAllocation".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &claim.object_ref(&())).await {
        tracing::warn!(claim = %key(claim), error = %e, "could not publish an event");
    }
}

/// Requeue with exponential backoff per claim: 250 ms doubling up to 30 s.
pub fn error_policy(claim: Arc<ResourceClaim>, err: &Error, ctx: Arc<Context>) -> Action {
    let mut failures = ctx.failures.lock().expect("not poisoned");
    let n = failures.entry(key(&claim)).or_insert(0);
    *n = n.saturating_add(1);
    let delay = Duration::from_millis(250u64 << (*n).min(7)).min(Duration::from_secs(30));
    tracing::warn!(claim = %key(&claim), error = %err, cause = err.metric_label(), retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

#[cfg(test)]
mod api_tests;
#[cfg(test)]
mod tests;
