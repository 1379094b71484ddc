//! The controller loop: a kube-runtime [`Controller`] over ResourceClaims (all namespaces),
//! triggered also by the pods that use them and by their AllocationClaims, that keeps each
//! claim's AllocationClaims equal to [`desired_allocation_claims`] (docs/design.md §6).
//! Each trigger source is filtered ([`crate::triggers`]): only a change of what the mirror reads
//! starts a reconcile, and the controller's own writes coming back do not.
//!
//! Pods, AllocationClaims and our ResourceSlices are kept in shared reflector stores, each object
//! reduced to what the mirror reads before it is cached (pods: [`keep_what_the_mirror_needs`];
//! slices: decoded straight into [`PublishedSlice`], listed [`SLICE_PAGE_SIZE`] at a time); the
//! triggers come from the same streams, so a reconcile always sees the change that caused it
//! (<https://docs.rs/kube/latest/kube/runtime/struct.Controller.html#method.owns_shared_stream>).
//! Writes are server-side apply with field manager [`FIELD_MANAGER`]; nothing is written when
//! the stored object already matches. A sweep deletes AllocationClaims whose ResourceClaim is
//! gone (the garbage collector does too, through the owner reference; the sweep covers a
//! cluster without it and makes a restarted controller converge at once) or no longer has that
//! device allocated (a claim deallocated while no controller ran starts no reconcile: its
//! fingerprint is "nothing to mirror" from the first sight).

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use das_api::allocation::{AllocationClaim, AllocationState};
use das_api::claim_status::DeviceStatusData;
use das_runtime::client::Clients;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;

use crate::metrics::Metrics;
use crate::mirror::{
    DeviceIndex, carry_transition_time, desired_allocation_claims, desired_names, object_apply,
    results_to_mirror, writes_needed,
};
use crate::published::{self, PublishedSlice, SLICE_PAGE_SIZE};
use crate::triggers::{Triggers, allocation_claim_key};

/// Field manager of every write (server-side apply).
pub const FIELD_MANAGER: &str = "das-controller";

/// Shared state of the reconciles.
pub struct Context {
    client: Client,
    pods: Store<Pod>,
    slices: Store<PublishedSlice>,
    allocs: Store<AllocationClaim>,
    metrics: Arc<Metrics>,
    recorder: Recorder,
    failures: Mutex<HashMap<String, u32>>,
    /// The trigger filters; the reconcile records its own writes in them.
    triggers: Arc<Triggers>,
    /// Every reflector store has its first complete list: until then a reconcile writes and
    /// deletes nothing (a missing pod or slice would look like a reason to).
    synced: AtomicBool,
}

/// Whether `a` mirrors the claim with `uid`.
fn owned_by(a: &AllocationClaim, uid: &str) -> bool {
    a.owner_references().iter().any(|o| o.uid == uid)
}

/// The pods the claim is reserved for, from the pod store.
pub fn reserving_pods(claim: &ResourceClaim, pods: &Store<Pod>) -> Vec<Pod> {
    let ns = claim.namespace().unwrap_or_default();
    claim
        .status
        .as_ref()
        .and_then(|s| s.reserved_for.as_ref())
        .into_iter()
        .flatten()
        .filter(|r| r.resource == "pods")
        .filter_map(|r| pods.get(&ObjectRef::new(&r.name).within(&ns)))
        .map(|p| (*p).clone())
        .collect()
}

/// The published devices of the pools the claim's results are in.
fn device_index(claim: &ResourceClaim, slices: &Store<PublishedSlice>) -> DeviceIndex {
    let pools: Vec<&str> = results_to_mirror(claim)
        .iter()
        .map(|r| r.pool.as_str())
        .collect();
    if pools.is_empty() {
        return DeviceIndex::default();
    }
    let relevant = slices.state_filter(|s| pools.contains(&s.pool.as_str()));
    published::device_index(relevant.iter().map(|s| s.as_ref()))
}

/// Seconds since `time` (RFC 3339), if it parses and is in the past.
fn seconds_since(time: &str) -> Option<f64> {
    let t: Timestamp = time.parse().ok()?;
    let d = Timestamp::now().duration_since(t);
    (!d.is_negative()).then(|| d.as_secs_f64())
}

/// The `lastTransitionTime` of the claim's `Ready` condition for `device`.
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

/// Makes `claim`'s AllocationClaims what they should be.
pub async fn reconcile(
    claim: Arc<ResourceClaim>,
    ctx: Arc<Context>,
) -> Result<Action, kube::Error> {
    if !ctx.synced.load(Ordering::Acquire) {
        return Ok(Action::requeue(Duration::from_millis(500)));
    }
    let result = mirror_claim(&claim, &ctx).await;
    ctx.metrics.reconciled(result.is_ok());
    if result.is_ok() {
        ctx.failures
            .lock()
            .expect("not poisoned")
            .remove(&key(&claim));
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

async fn mirror_claim(claim: &ResourceClaim, ctx: &Context) -> Result<(), kube::Error> {
    let ns = claim.namespace().unwrap_or_default();
    let uid = claim.uid().unwrap_or_default();
    let pods = reserving_pods(claim, &ctx.pods);
    let index = device_index(claim, &ctx.slices);
    let now = Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    let mirror = desired_allocation_claims(claim, &pods, &index, &now);
    if !mirror.unmirrored.is_empty() {
        warn_unmirrored(claim, &mirror.unmirrored, ctx).await;
    }
    let existing = ctx
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
        delete(&api, &stale.name_any(), ctx).await?;
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
) -> Result<(), kube::Error> {
    let w = writes_needed(desired, current);
    let name = desired.name_any();
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    if w.object {
        let (object, intended) = object_apply(desired, current);
        ctx.triggers.own_writes.record(&intended);
        let answer = api.patch(&name, &pp, &Patch::Apply(&object)).await?;
        ctx.triggers.own_writes.wrote(answer);
        ctx.metrics.wrote("apply");
    }
    if w.status {
        let body = json!({
            "apiVersion": AllocationClaim::api_version(&()),
            "kind": AllocationClaim::kind(&()),
            "metadata": {"name": name},
            "status": desired.status,
        });
        ctx.triggers.own_writes.record(desired);
        let answer = api.patch_status(&name, &pp, &Patch::Apply(&body)).await?;
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

/// Deletes one AllocationClaim; already gone is fine.
async fn delete(api: &Api<AllocationClaim>, name: &str, ctx: &Context) -> Result<(), kube::Error> {
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => {
            ctx.metrics.wrote("delete");
            tracing::info!(allocation_claim = %name, namespace = ?api.resource_url(), "deleted");
            Ok(())
        }
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e),
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
fn error_policy(claim: Arc<ResourceClaim>, err: &kube::Error, ctx: Arc<Context>) -> Action {
    let mut failures = ctx.failures.lock().expect("not poisoned");
    let n = failures.entry(key(&claim)).or_insert(0);
    *n = n.saturating_add(1);
    let delay = Duration::from_millis(250u64 << (*n).min(7)).min(Duration::from_secs(30));
    tracing::warn!(claim = %key(&claim), error = %err, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

/// A container reduced to its name and the claims it uses.
fn claims_only(c: k8s_openapi::api::core::v1::Container) -> k8s_openapi::api::core::v1::Container {
    k8s_openapi::api::core::v1::Container {
        name: c.name,
        resources: c.resources.and_then(|r| {
            r.claims
                .map(|claims| k8s_openapi::api::core::v1::ResourceRequirements {
                    claims: Some(claims),
                    ..Default::default()
                })
        }),
        ..Default::default()
    }
}

/// What the controller keeps of a pod: name, namespace, UID, `spec.nodeName`,
/// `spec.resourceClaims`, `status.resourceClaimStatuses` and, of each (init) container, its
/// name and `resources.claims` (for `das_mig_device_info`). Everything else (images, env,
/// volumes, managed fields, labels, annotations, other status) is dropped before the pod enters
/// the cache, so the cache's memory per pod stays small in a cluster of many pods.
pub fn keep_what_the_mirror_needs(pod: &mut Pod) {
    let meta = std::mem::take(&mut pod.metadata);
    pod.metadata.name = meta.name;
    pod.metadata.namespace = meta.namespace;
    pod.metadata.uid = meta.uid;
    pod.metadata.resource_version = meta.resource_version;
    pod.metadata.deletion_timestamp = meta.deletion_timestamp;
    if let Some(spec) = pod.spec.take() {
        pod.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            node_name: spec.node_name,
            resource_claims: spec.resource_claims,
            containers: spec.containers.into_iter().map(claims_only).collect(),
            init_containers: spec
                .init_containers
                .map(|cs| cs.into_iter().map(claims_only).collect()),
            ..Default::default()
        });
    }
    if let Some(status) = pod.status.take() {
        pod.status = Some(k8s_openapi::api::core::v1::PodStatus {
            resource_claim_statuses: status.resource_claim_statuses,
            ..Default::default()
        });
    }
}

/// The claims allocated devices in the pool of `slice`: a change of the slice (published again
/// after a kubelet restart wiped it) re-triggers them, so their AllocationClaims get the device
/// facts back.
fn claims_in_pool(
    slice: &PublishedSlice,
    claims: &Store<ResourceClaim>,
) -> Vec<ObjectRef<ResourceClaim>> {
    let pool = slice.pool.as_str();
    claims
        .state()
        .iter()
        .filter(|c| results_to_mirror(c).iter().any(|r| r.pool == pool))
        .map(|c| ObjectRef::from_obj(c.as_ref()))
        .collect()
}

/// A reflector over `api`, shared: returns its store, the trigger stream of its changes and the
/// future that drives it. `trim` reduces each object before it is cached.
fn shared<K>(
    api: Api<K>,
    cfg: watcher::Config,
    trim: fn(&mut K),
) -> (
    Store<K>,
    reflector::ReflectHandle<K>,
    impl Future<Output = ()> + Send,
)
where
    K: Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + Send
        + Sync
        + serde::de::DeserializeOwned
        + 'static,
{
    let (reader, writer) = reflector::store_shared(1024);
    let subscriber = writer.subscribe().expect("a shared store has subscribers");
    let drive = watcher(api, cfg)
        .default_backoff()
        .modify(trim)
        .reflect_shared(writer)
        .for_each(|ev| async move {
            if let Err(e) = ev {
                tracing::warn!(error = %e, "watch");
            }
        });
    (reader, subscriber, drive)
}

/// The watch of our ResourceSlices: the DAS driver's only, the initial list in pages of
/// [`SLICE_PAGE_SIZE`] (each decoded straight into [`PublishedSlice`]s).
fn slice_watch_config() -> watcher::Config {
    watcher::Config::default()
        .fields(&format!("spec.driver={}", das_api::DRIVER_NAME))
        .page_size(SLICE_PAGE_SIZE)
}

/// Default of how many ResourceClaims are reconciled at once (`--concurrent-reconciles`).
///
/// A reconcile spends nearly all its time waiting for its writes, so the limit only queues
/// claims behind each other: in a 200-pod burst on a 2-core machine, the device-ready →
/// `inUse` p99 was 1.1–6.1 s with 16 and 0.4–1.8 s with 64 (docs/benchmarks.md,
/// "AllocationClaim controller"). Each in-flight reconcile holds at most one API request.
pub const DEFAULT_CONCURRENT_RECONCILES: u16 = 64;

/// Runs the controller until `shutdown` resolves, with at most `concurrent_reconciles`
/// reconciles at once (0 means no limit). Watches use `clients.watches`; reads and writes
/// (AllocationClaims, Events, the sweep) use `clients.calls`, whose timeouts bound them.
pub async fn run(
    clients: Clients,
    metrics: Arc<Metrics>,
    identity: String,
    concurrent_reconciles: u16,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let Clients {
        calls: client,
        watches,
    } = clients;
    let all = watcher::Config::default();
    let (pods, pod_events, pod_drive) = shared(
        Api::<Pod>::all(watches.clone()),
        all.clone(),
        keep_what_the_mirror_needs,
    );
    let (allocs, alloc_events, alloc_drive) = shared(
        Api::<AllocationClaim>::all(watches.clone()),
        all.clone(),
        |_| {},
    );
    let (slices, slice_events, slice_drive) = shared(
        Api::<PublishedSlice>::all(watches.clone()),
        slice_watch_config(),
        |_| {},
    );
    let triggers = Arc::new(Triggers::default());
    // The claims' own reflector: the controller's trigger stream, filtered by what changed.
    let (claims, claim_writer) = reflector::store();
    let claim_filter = triggers.clone();
    let claim_events = watcher(Api::<ResourceClaim>::all(watches), all)
        .default_backoff()
        .reflect(claim_writer)
        .applied_objects()
        .try_filter(move |c| std::future::ready(claim_filter.on_claim(c)));
    let reporter = Reporter {
        controller: FIELD_MANAGER.into(),
        instance: Some(identity),
    };
    let ctx = Arc::new(Context {
        recorder: Recorder::new(client.clone(), reporter),
        client: client.clone(),
        pods: pods.clone(),
        slices: slices.clone(),
        allocs: allocs.clone(),
        metrics: metrics.clone(),
        failures: Mutex::default(),
        triggers: triggers.clone(),
        synced: AtomicBool::new(false),
    });
    metrics.export_device_info(claims.clone(), pods.clone());
    let (claims_of_pod, claims_of_slice) = (claims.clone(), claims.clone());
    let (pod_filter, alloc_filter) = (triggers.clone(), triggers.clone());
    let own_changes =
        alloc_events.filter(move |a| std::future::ready(alloc_filter.on_allocation_claim(a)));
    let controller = Controller::for_stream(claim_events, claims.clone())
        .with_config(
            kube::runtime::controller::Config::default().concurrency(concurrent_reconciles),
        )
        .owns_shared_stream(own_changes)
        .watches_shared_stream(pod_events, move |p: Arc<Pod>| {
            pod_filter.on_pod(&p, |r| {
                claims_of_pod
                    .get(r)
                    .is_some_and(|c| !results_to_mirror(&c).is_empty())
            })
        })
        .watches_shared_stream(slice_events, move |s: Arc<PublishedSlice>| {
            claims_in_pool(&s, &claims_of_slice)
        });
    let sweeper = sweep_loop(Sweep {
        client,
        claims: claims.clone(),
        allocs: allocs.clone(),
        pods: pods.clone(),
        metrics: metrics.clone(),
        triggers,
    });
    let synced = ctx.clone();
    let ready = async {
        let _ = tokio::join!(
            pods.wait_until_ready(),
            allocs.wait_until_ready(),
            slices.wait_until_ready(),
            claims.wait_until_ready()
        );
        synced.synced.store(true, Ordering::Release);
        metrics.probe.set_ready(true);
        tracing::info!("caches synced");
        std::future::pending::<()>().await
    };
    let run = controller
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|_| async {});
    tokio::select! {
        _ = run => {},
        _ = pod_drive => {},
        _ = alloc_drive => {},
        _ = slice_drive => {},
        _ = sweeper => {},
        _ = ready => {},
    }
}

/// What the sweep reads and writes.
struct Sweep {
    client: Client,
    claims: Store<ResourceClaim>,
    allocs: Store<AllocationClaim>,
    pods: Store<Pod>,
    metrics: Arc<Metrics>,
    triggers: Arc<Triggers>,
}

/// Every few seconds, once the caches are synced: deletes AllocationClaims no live allocation
/// wants, updates the per-state gauge and forgets the fingerprints of deleted objects.
async fn sweep_loop(s: Sweep) {
    let _ = tokio::join!(
        s.claims.wait_until_ready(),
        s.allocs.wait_until_ready(),
        s.pods.wait_until_ready()
    );
    loop {
        sweep(&s).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// Whether `a` mirrors a device `claims` still has allocated: its owner is live and allocated
/// that device.
fn still_wanted(a: &AllocationClaim, claims: &HashMap<String, Arc<ResourceClaim>>) -> bool {
    a.owner_references()
        .iter()
        .filter_map(|o| claims.get(&o.uid))
        .any(|c| desired_names(c).contains(&a.name_any()))
}

async fn sweep(s: &Sweep) {
    // AllocationClaims first: each was written from a claim the claim cache held before, so the
    // claims read after them are at least that new, and a just-mirrored allocation is wanted.
    let allocs = s.allocs.state();
    let live: HashMap<String, Arc<ResourceClaim>> = s
        .claims
        .state()
        .into_iter()
        .filter_map(|c| Some((c.uid()?, c)))
        .collect();
    let mut counts: HashMap<AllocationState, i64> = HashMap::new();
    for a in &allocs {
        if let Some(st) = a.status.as_ref() {
            *counts.entry(st.state).or_default() += 1;
        }
        if still_wanted(a, &live) {
            continue;
        }
        let api: Api<AllocationClaim> =
            Api::namespaced(s.client.clone(), &a.namespace().unwrap_or_default());
        s.triggers
            .own_writes
            .forget_latest(&allocation_claim_key(a));
        match api.delete(&a.name_any(), &DeleteParams::background()).await {
            Ok(_) => {
                s.metrics.wrote("delete");
                tracing::info!(allocation_claim = %a.name_any(), "deleted: no live allocation of its ResourceClaim wants it");
            }
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => tracing::warn!(error = %e, "sweep"),
        }
    }
    let counts: Vec<_> = counts.into_iter().collect();
    s.metrics.set_claims(&counts);
    let t = &s.triggers;
    t.claims.retain(|uid| live.contains_key(uid));
    let pods: std::collections::HashSet<String> =
        s.pods.state().iter().filter_map(|p| p.uid()).collect();
    t.pods.retain(|uid| pods.contains(uid));
    let cached: HashMap<String, Option<String>> = allocs
        .iter()
        .map(|a| (allocation_claim_key(a), a.metadata.resource_version.clone()))
        .collect();
    t.own_writes.retain(&cached);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::triggers::claims_of_pod;

    #[test]
    fn pods_map_to_their_claims() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": [], "resourceClaims": [
                {"name": "a", "resourceClaimName": "shared"},
                {"name": "b", "resourceClaimTemplateName": "t"}]},
            "status": {"resourceClaimStatuses": [{"name": "b", "resourceClaimName": "p-b-x1"}]}
        }))
        .unwrap();
        let names: Vec<_> = claims_of_pod(&pod)
            .into_iter()
            .map(|r| r.to_string())
            .collect();
        assert_eq!(names.len(), 2);
        assert!(
            names
                .iter()
                .any(|n| n.contains("ns") && n.contains("p-b-x1"))
        );
        assert!(names.iter().any(|n| n.contains("shared")));
    }

    #[test]
    fn the_pod_cache_keeps_only_what_the_mirror_reads() {
        let mut pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u", "resourceVersion": "7",
                "labels": {"a": "b"}, "annotations": {"big": "x".repeat(10_000)},
                "managedFields": [{"manager": "kubectl"}]},
            "spec": {"nodeName": "n0", "containers": [{"name": "c", "image": "i",
                "env": [{"name": "A", "value": "x".repeat(10_000)}],
                "resources": {"limits": {"cpu": "1"}, "claims": [{"name": "a"}]}}],
                "resourceClaims": [{"name": "a", "resourceClaimName": "shared"}]},
            "status": {"phase": "Running", "podIP": "10.0.0.1",
                "resourceClaimStatuses": [{"name": "a", "resourceClaimName": "shared"}]}
        }))
        .unwrap();
        let before = serde_json::to_vec(&pod).unwrap().len();
        let mapped = claims_of_pod(&pod);
        keep_what_the_mirror_needs(&mut pod);
        let after = serde_json::to_vec(&pod).unwrap().len();
        assert!(after * 20 < before, "{before} -> {after} bytes");
        assert_eq!(pod.metadata.uid.as_deref(), Some("u"));
        assert_eq!(pod.spec.as_ref().unwrap().node_name.as_deref(), Some("n0"));
        assert!(pod.metadata.labels.is_none() && pod.metadata.managed_fields.is_none());
        assert_eq!(
            crate::device_info::containers_using(&pod, "shared", "r"),
            ["c"],
            "which container uses which claim is kept"
        );
        let c = &pod.spec.as_ref().unwrap().containers[0];
        assert!(c.image.is_none() && c.env.is_none());
        assert!(c.resources.as_ref().unwrap().limits.is_none());
        assert_eq!(claims_of_pod(&pod), mapped, "the claim mapping is the same");
    }

    #[test]
    fn ready_time_in_milliseconds_wins_over_the_whole_second_condition() {
        let claim = |data: serde_json::Value| -> ResourceClaim {
            serde_json::from_value(json!({
                "metadata": {"name": "c", "namespace": "ns"},
                "spec": {"devices": {"requests": []}},
                "status": {"devices": [{"driver": "mig.das.com", "pool": "n0", "device": "d",
                    "conditions": [{"type": "Ready", "status": "True", "reason": "SliceCreated",
                        "message": "", "lastTransitionTime": "2026-01-01T00:00:01Z"}],
                    "data": data}]}
            }))
            .unwrap()
        };
        let base = json!({"migUUID": "MIG-1", "gpuUUID": "GPU-a", "profile": "1g.10gb",
            "placement": {"start": 0, "size": 1}});
        let mut with_time = base.clone();
        with_time["readyTime"] = json!("2026-01-01T00:00:01.250Z");
        assert_eq!(
            ready_since(&claim(with_time), "d").as_deref(),
            Some("2026-01-01T00:00:01.250Z")
        );
        assert_eq!(
            ready_since(&claim(base), "d").as_deref(),
            Some("2026-01-01T00:00:01Z"),
            "older plugins: the condition"
        );
        assert!(seconds_since("2026-01-01T00:00:01.250Z").is_some());
    }

    #[test]
    fn our_slices_are_listed_in_small_pages() {
        let cfg = slice_watch_config();
        assert_eq!(cfg.page_size, Some(SLICE_PAGE_SIZE));
        assert!(SLICE_PAGE_SIZE < watcher::Config::default().page_size.unwrap());
        assert_eq!(
            cfg.field_selector.as_deref(),
            Some("spec.driver=mig.das.com")
        );
    }

    #[test]
    fn seconds_since_parses_rfc3339() {
        assert!(seconds_since("2020-01-01T00:00:00Z").unwrap() > 0.0);
        assert!(seconds_since("garbage").is_none());
    }
}
